// What one rank of a run will hold, estimated before any rank starts (docs/memory.md), from
// the built model (Note [Model families]): its units' param counts and what its family's
// blocks keep for backward.
#pragma once

#include <cstdint>

#include "runtime/trainer.h"

namespace fsdp::runtime {

struct MemoryEstimate {
  int64_t device_bytes = 0;  // the device's peak (on the CPU backend, its allocator's ledger)
  int64_t host_bytes = 0;    // host memory besides: the params' initial values while sharding
};

// One rank of `config` whose params shard over `shard_ranks` ranks (world / --hsdp).
MemoryEstimate estimate_rank_memory(const TrainConfig& config, int shard_ranks);

}  // namespace fsdp::runtime
