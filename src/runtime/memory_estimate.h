// What one rank of a run will hold, estimated before any rank starts (docs/memory.md), from
// the built model (Note [Model families]): its units' param counts and what its family's
// blocks keep for backward.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/trainer.h"

namespace fsdp::models {
class ModelFamily;
}

namespace fsdp::runtime {

struct MemoryEstimate {
  int64_t device_bytes = 0;  // the device's peak (on the CPU backend, its allocator's ledger)
  int64_t host_bytes = 0;    // host memory besides: the params' initial values while sharding
};

// The model's part of the estimate, made once (it builds the model) and then evaluated for
// configs that differ from the one it was made for only in what a planner chooses
// (checkpointing, the RS ring's k, reshard after forward, micro-batches and so tokens per
// micro-batch, Note [Memory plans] in memory_planner.h).
class RankMemoryModel {
 public:
  // One rank of `config` whose params shard over `shard_ranks` ranks (world / --hsdp).
  RankMemoryModel(const TrainConfig& config, int shard_ranks);
  MemoryEstimate estimate(const TrainConfig& config) const;
  int shard_ranks() const { return world_; }
  // The params of every unit together, and of each (the blocks, then the root).
  int64_t total_params() const { return total_; }
  const std::vector<int64_t>& unit_params() const { return units_; }
  const nn::ModelConfig& model() const { return model_; }

 private:
  nn::ModelConfig model_;
  const models::ModelFamily* family_ = nullptr;
  int world_ = 1;
  std::vector<int64_t> units_;
  std::vector<int64_t> block_experts_;  // each block's expert params (its own FSDP group)
  // Each unit's params gathered as one byte each (tensorwise fp8 with the float8 all-gather).
  std::vector<int64_t> unit_fp8_params_;
  int64_t total_ = 0, expert_params_ = 0, output_dim_ = 0;
  int expert_world_ = 1;
};

// One rank of `config` whose params shard over `shard_ranks` ranks (world / --hsdp).
MemoryEstimate estimate_rank_memory(const TrainConfig& config, int shard_ranks);

}  // namespace fsdp::runtime
