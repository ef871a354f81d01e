// The trainer on GPUs: one process per GPU on this machine, or one process started by an
// external launcher (torchrun), through the public launcher (include/fsdp/launch.h).
#pragma once

#include <functional>
#include <vector>

#include "fsdp/launch.h"
#include "runtime/trainer.h"

namespace fsdp::runtime {

using fsdp::visible_gpu_count;

// Trains on the GPUs `launch` describes (LaunchOptions: --nproc, --nnodes, ...). Rank 0's steps
// are reported through on_step; returns the results of the ranks this process ran, rank 0's
// first (ranks send theirs to the parent). Sets world_out. A process that did not run rank 0
// (another node's, or a rank under torchrun) exits here once its ranks are done.
std::vector<RankResult> run_cuda_training(const LaunchOptions& launch, const TrainConfig& config,
                                          const std::function<void(const StepReport&)>& on_step,
                                          int& world_out);

}  // namespace fsdp::runtime
