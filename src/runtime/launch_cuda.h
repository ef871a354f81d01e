// One process per GPU on this machine (fork), or one process started by an external
// launcher (torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT).
#pragma once

#include <functional>
#include <vector>

#include "runtime/trainer.h"

namespace fsdp::runtime {

// GPUs visible to a child process; the parent's CUDA stays untouched, so it can still fork.
int visible_gpu_count();

// Trains on `nproc` GPUs (0: all). Rank 0's steps are reported through on_step; returns
// every rank's result (ranks send theirs to the parent). Sets world_out.
std::vector<RankResult> run_cuda_training(int nproc, const TrainConfig& config,
                                          const std::function<void(const StepReport&)>& on_step,
                                          int& world_out);

}  // namespace fsdp::runtime
