// The trainer on GPUs: one process per GPU on this machine, or one process started by an
// external launcher (torchrun), through the public launcher (include/fsdp/launch.h).
#pragma once

#include <functional>
#include <vector>

#include "fsdp/launch.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

using fsdp::visible_gpu_count;

// Trains on `nproc` GPUs (0: all). Rank 0's steps are reported through on_step; returns
// every rank's result (ranks send theirs to the parent). Sets world_out.
std::vector<RankResult> run_cuda_training(int nproc, const TrainConfig& config,
                                          const std::function<void(const StepReport&)>& on_step,
                                          int& world_out);

}  // namespace fsdp::runtime
