// One rank's training loop, shared by the CLI, the tests and the benchmarks.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/checkpoint.h"
#include "fsdp/comm.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/nn/model.h"
#include "fsdp/optim.h"
#include "fsdp/optim_offload.h"
#include "optim/lr_schedule.h"
#include "runtime/batch_source.h"
#include "runtime/rank_result_fields.h"

namespace fsdp::runtime {

// What hooks (checkpoints, evaluation) reach during a run.
struct TrainState {
  Device& device;
  nn::Model& model;
  FsdpModule& root;
  optim::Optimizer& optimizer;
  Stream compute;
  int next_step = 0;  // the step the loop runs next; on_start may move it (resume)
};

struct TrainConfig {
  nn::ModelConfig model;
  int64_t tokens = 64;  // per rank per step (per micro-batch)
  int steps = 5;
  int warmup = 0;       // steps left out of the timing statistics
  // > 1: gradient accumulation with set_requires_gradient_sync(false) on all but the last; each
  // micro-batch's loss gradient is scaled by 1 / micro_batches, so a step trains on the mean
  // loss over its micro-batches (N micro-batches of B/N rows == one batch of B rows).
  int micro_batches = 1;
  // Capture one whole step in a CUDA graph after the warm-up steps (at least one) and replay
  // it for the rest (Note [Captured steps]); the CPU backend raises a UserError.
  bool cuda_graph = false;
  uint64_t seed = 1;
  DType param_dtype = DType::F32;
  DType reduce_dtype = DType::F32;
  // fp8 GEMMs in the blocks' Linears (docs/fp8.md; nn::enable_fp8); tensorwise weights are
  // all-gathered as fp8 unless fp8_all_gather is off (MixedPrecisionPolicy::fp8_all_gather).
  Fp8Recipe fp8 = Fp8Recipe::None;
  bool fp8_all_gather = true;
  bool reshard_after_forward = true;
  // > 0: the blocks reshard after forward to groups of this many ranks (FSDP2's
  // reshard_after_forward=<int>, Note [Post-forward mesh]); it must divide the shard size.
  int reshard_after_forward_size = 0;
  // > 0: HSDP with this many replicas (--hsdp R): the world is an R x (W / R) mesh, params
  // shard over W / R consecutive ranks and are replicated R times (docs/hsdp.md).
  int hsdp_replicas = 0;
  int rs_max_input_buffers = 1;
  bool separate_rs_group = false;
  bool experts_on_own_mesh = true;  // moe: expert params shard over a second mesh
  // Which blocks keep only their input for backward and recompute the rest there, or keep
  // their GEMMs' outputs only (Note [Activation checkpointing]).
  nn::ActivationCheckpointConfig activation_checkpoint;
  optim::OptimizerConfig optimizer;  // optimizer.max_grad_norm > 0: clipping
  optim::LrSchedule schedule;        // around the optimizer's lr (its peak)
  // Inputs of each micro-batch (Note [Batch sources]); empty: the synthetic features.
  BatchSourceFactory batch_source;
  // A non-finite loss or grad norm stops the run at that step (Note [Non-finite steps]).
  // false: train_rank raises a UserError; true: it returns the result so far with `error` set.
  bool return_on_nonfinite = false;
  // Validation (Note [Evaluation]): after every eval_every-th step and the last, the mean loss
  // over batches 0 .. eval_batches-1 of eval_source, forward only. 0 or no source: none.
  BatchSourceFactory eval_source;
  int eval_every = 0;
  int64_t eval_batches = 0;
  std::function<void(TrainState&)> on_start;    // after the optimizer is made, before step 0
  std::function<void(TrainState&)> after_step;  // after each step's work is issued
  // After the step's last backward, before the grad norm and the optimizer (fault injection).
  std::function<void(TrainState&)> after_backward;
  // Each group's optimizer step runs right after its reduce-scatter (Note [Optimizer in
  // backward]); off: one multi-tensor step after backward, with persistent grad shards.
  bool optimizer_in_backward = false;
  // Each group's step runs in the next forward, just before its all-gather, on the
  // all-gather stream (Note [Optimizer in forward]); clipping works. Off: one multi-tensor
  // step after backward on the compute stream.
  bool optimizer_in_forward = false;
  // The fp32 masters, grads and optimizer state in host memory and the step on the host
  // (Note [Optimizer offload], fsdp/optim_offload.h). offload.ranks_sharing_host 0: every
  // rank of the world shares the host's memory.
  bool offload_optimizer = false;
  optim::OffloadOptions offload;
  // FSDP2's zero_grad(set_to_none=True): the grad shards are freed after each optimizer step
  // and made again by the next backward (Note [Grads set to none] in fsdp/fsdp.h). Not with a
  // CUDA graph, the optimizer in forward or offloaded, or in backward (it has no grad shards).
  bool zero_grad_set_to_none = false;
  // Between steps, start the first unit's all-gather for the next step (FsdpModule::unshard
  // with async_op) so it runs while the host finishes the step.
  bool prefetch_next_step = false;
  // Compare a fingerprint of every collective across ranks before it runs (a debug mode:
  // Note [Collective fingerprints] in src/comm/collective_check.cpp).
  bool check_collectives = false;
  bool timeline = false;
  bool collect_params = false;      // gather full fp32 params after the last step
  RsReclaimPolicy rs_policy = RsReclaimPolicy::BoundedRing;
  std::vector<ScheduleEvent>* event_log = nullptr;  // rank 0's schedule events
  CheckpointOptions checkpoint;  // --save-dir, --resume, --init-from (Note [Checkpoint hooks])
  std::string data_name = "synthetic";  // what batch_source reads (a checkpoint records it)
  // The memory plan that chose this config's checkpointing, k, reshard after forward and
  // micro-batches (Note [Memory plans] in runtime/memory_planner.h): its settings, the peak it
  // predicts and the budget it fits; empty and 0 without one (the trainer then reports the
  // estimate's peak, and an out-of-memory error plans for the device's capacity).
  std::string memory_plan;
  int64_t predicted_peak_bytes = 0;
  int64_t memory_budget_bytes = 0;
  // Called after fully_shard on every rank, before the first step (prefetch lists etc.).
  std::function<void(nn::Model&, FsdpModule& root)> customize;
};

// Note [Unreadable steps]
// A step whose inputs cannot be read (a token file truncated or rewritten while training) ends
// the run at that step, like a non-finite one (Note [Non-finite steps]); but only the ranks
// whose rows were lost see it, so it is raised, as "step N: <the reader's error>", and the
// launcher aborts the others (their collectives fail at once, naming this rank). The command
// still writes its JSON summary: the steps reported before, the error and its step (with
// ranks as processes, whose errors reach the command as text, the first step not reported).
class StepError : public UserError {
 public:
  StepError(int step, const std::string& what) : UserError(what), step_(step) {}
  int step() const { return step_; }  // 0-based

 private:
  int step_;
};

// One step, as rank 0 reports it to on_step (Note [Result fields]: the members are
// FSDP_STEP_FIELDS).
struct StepReport {
  FSDP_STEP_FIELDS(FSDP_DECLARE_STEP_FIELD)
};

// What a rank's run gives back (Note [Result fields]: the members are FSDP_STEP_COLUMNS, one
// entry per finished step, then FSDP_RANK_RESULT_FIELDS).
struct RankResult {
  FSDP_STEP_COLUMNS(FSDP_DECLARE_STEP_COLUMN)
  FSDP_RANK_RESULT_FIELDS(FSDP_DECLARE_RESULT_FIELD)
};

// Refuses a config that cannot train on `world_size` ranks, in one line naming the option
// (an OptionError, Note [Options checked once]). train_rank calls it first.
void check_train_config(const TrainConfig& config, int world_size);
// Note [Grads set to none]: whether the config's grad shards must outlive each step (a CUDA
// graph, the optimizer in forward, offloaded or in backward), so zero_grad_set_to_none cannot
// apply; check_train_config refuses it there, a reason for each.
bool grads_outlive_step(const TrainConfig& config);

// FSDP training on one rank. `world` spans all ranks; `on_step` (may be empty) runs on
// every rank after each step.
RankResult train_rank(Device& device, std::shared_ptr<Comm> world, const TrainConfig& config,
                      const std::function<void(const StepReport&)>& on_step = {});

// The unsharded reference: one rank, no FSDP, fp32, trained on the global batch that
// `world_size` ranks of `config.tokens` tokens each would see.
RankResult train_local_reference(Device& device, const TrainConfig& config, int world_size);

}  // namespace fsdp::runtime
