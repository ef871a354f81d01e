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
#include "optim/lr_schedule.h"
#include "runtime/batch_source.h"

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

struct StepReport {
  int step = 0;
  float loss = 0;
  float lr = 0;
  float grad_norm = -1;  // the global norm before clipping; -1: not computed (optimizer in backward)
  int64_t tokens = 0;    // this rank's tokens in the step
  float val_loss = -1;   // the validation loss after this step; -1: not evaluated
  double step_ms = 0;
  // From this step's timeline, when tracing (config.timeline); -1 otherwise.
  double exposed_comm_ms = -1;
  double rs_recycle_stall_ms = -1;
  // MoE transformer: the busiest expert's share of this rank's routed tokens (max over MoE
  // layers, last micro-batch); -1 for other models.
  double max_expert_load = -1;
};

struct RankResult {
  int rank = 0;
  std::vector<float> losses;      // one per finished step (finite)
  std::vector<float> lrs;
  std::vector<float> grad_norms;  // -1 where not computed
  std::vector<double> step_ms;
  std::vector<std::pair<int, float>> val_losses;  // (step, 0-based; validation loss)
  // Set when a step's loss or grad norm was not finite (with return_on_nonfinite): the
  // one-line message, and the 0-based step.
  std::string error;
  int failed_step = -1;
  std::vector<double> max_expert_loads;  // per step (StepReport::max_expert_load)
  // The device's peak memory since the first step, read when each step is read (a step is read
  // while the next one runs, so entry i covers the start of step i + 1): flat memory means the
  // entries stop growing after the first steps.
  std::vector<int64_t> peak_bytes_by_step;
  double host_schedule_us_per_unit = 0;  // host time in forward+backward calls per unit
  MemStats memory;
  int64_t collectives_first_step[kCollectiveKindCount] = {};  // on the main mesh + RS comms
  int64_t all_gathers_forward_first_step = 0;
  int64_t all_gathers_backward_first_step = 0;
  int64_t reduce_scatters_first_step = 0;
  // Per communicator (by name: "dp/shard", "dp/replicate", "dp/shard/post_forward2", ...):
  // collectives of each kind issued by the first micro-batch's forward and its backward.
  std::map<std::string, std::vector<int64_t>> forward_by_comm_first_step;
  std::map<std::string, std::vector<int64_t>> backward_by_comm_first_step;
  int64_t param_count = 0;  // active params (Model::active_param_count)
  int64_t sharded_state_bytes = 0;
  // Host time to issue a step (batch, scalars, and the step's work or its replay), mean over
  // the timed steps after the warm-up (and after the capture, under a graph); the host's waits
  // for the device are left out where the backend counts them (Device::host_wait_us).
  double host_us_per_step = 0;
  int64_t backend_peak_bytes = 0;  // Device::backend_peak_bytes() at the end
  int64_t backend_reserved_peak_bytes = 0;  // Device::backend_reserved_peak_bytes() at the end
  int captured_step = -1;          // the step recorded into the graph; -1: none
  std::vector<std::string> graph_streams;  // the streams the graph's work runs on
  bool graph_op_times = false;  // replayed steps are timed op by op on the timeline
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
