// Starting ranks for the trainer and the tests: the public launcher (include/fsdp/launch.h),
// with the CPU backend's full options.
#pragma once

#include <functional>
#include <vector>

#include "launch/cpu_ranks.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

using fsdp::RankBody;

// Runs `body` on `world_size` rank threads sharing one CpuWorld. If any rank throws, the
// world is aborted (so the others stop instead of hanging) and the first error is rethrown.
inline void run_cpu_ranks(int world_size, const cpu::CpuOptions& options, const RankBody& body) {
  launch::run_cpu_world(world_size, options, body);
}

// Trains on `nproc` CPU ranks that are processes of this host (and, with where.nnodes > 1, as
// many on each other host); rank 0's steps are reported through on_step, from its process.
// Returns this host's ranks' results in rank order; throws naming the first failure.
std::vector<RankResult> run_cpu_process_training(
    int nproc, const cpu::CpuOptions& options, const CpuProcessOptions& where,
    const TrainConfig& config, const std::function<void(const StepReport&)>& on_step = {});

}  // namespace fsdp::runtime
