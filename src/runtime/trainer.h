// One rank's training loop, shared by the CLI, the tests and the benchmarks.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/fsdp.h"
#include "nn/model.h"
#include "optim/optimizer.h"

namespace fsdp::runtime {

struct TrainConfig {
  nn::ModelConfig model;
  int64_t tokens = 64;  // per rank per step (per micro-batch)
  int steps = 5;
  int warmup = 0;       // steps left out of the timing statistics
  int micro_batches = 1;  // > 1: gradient accumulation with set_requires_gradient_sync(false)
  uint64_t seed = 1;
  DType param_dtype = DType::F32;
  DType reduce_dtype = DType::F32;
  bool reshard_after_forward = true;
  int rs_max_input_buffers = 1;
  bool separate_rs_group = false;
  bool experts_on_own_mesh = true;  // moe: expert params shard over a second mesh
  optim::OptimizerConfig optimizer;
  // Each group's optimizer step runs right after its reduce-scatter (Note [Optimizer in
  // backward]); off: one multi-tensor step after backward, with persistent grad shards.
  bool optimizer_in_backward = false;
  // Between steps, start the first unit's all-gather for the next step (FsdpModule::unshard
  // with async_op) so it runs while the host finishes the step.
  bool prefetch_next_step = false;
  bool timeline = false;
  bool collect_params = false;      // gather full fp32 params after the last step
  RsReclaimPolicy rs_policy = RsReclaimPolicy::BoundedRing;
  std::vector<ScheduleEvent>* event_log = nullptr;  // rank 0's schedule events
  CheckpointOptions checkpoint;  // --save-dir, --resume, --init-from (Note [Checkpoint hooks])
  // Called after fully_shard on every rank, before the first step (prefetch lists etc.).
  std::function<void(nn::Model&, FsdpModule& root)> customize;
};

struct StepReport {
  int step = 0;
  float loss = 0;
  double step_ms = 0;
  // From this step's timeline, when tracing (config.timeline); -1 otherwise.
  double exposed_comm_ms = -1;
  double rs_recycle_stall_ms = -1;
};

struct RankResult {
  int rank = 0;
  std::vector<float> losses;
  std::vector<double> step_ms;
  double host_schedule_us_per_unit = 0;  // host time in forward+backward calls per unit
  MemStats memory;
  int64_t collectives_first_step[kCollectiveKindCount] = {};  // on the main mesh + RS comms
  int64_t all_gathers_forward_first_step = 0;
  int64_t all_gathers_backward_first_step = 0;
  int64_t reduce_scatters_first_step = 0;
  int64_t param_count = 0;
  int64_t sharded_state_bytes = 0;
  std::vector<std::vector<float>> params;  // when collect_params
  Timeline timeline;
};

// FSDP training on one rank. `world` spans all ranks; `on_step` (may be empty) runs on
// every rank after each step.
RankResult train_rank(Device& device, std::shared_ptr<Comm> world, const TrainConfig& config,
                      const std::function<void(const StepReport&)>& on_step = {});

// The unsharded reference: one rank, no FSDP, fp32, trained on the global batch that
// `world_size` ranks of `config.tokens` tokens each would see.
RankResult train_local_reference(Device& device, const TrainConfig& config, int world_size);

}  // namespace fsdp::runtime
