// AdamW and SGD over fp32 shards: one multi-tensor launch per step, with the lr, the bias
// corrections and the clip bound in device memory (Note [Step scalars] in fsdp/device.h), and
// clipping by the global gradient norm across shards.
#pragma once

#include <string>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/device.h"

namespace fsdp::optim {

struct ParamSpan {
  float* param = nullptr;
  float* grad = nullptr;
  int64_t numel = 0;
  // The communicator of the mesh this shard belongs to: its grad's sum of squares is
  // all-reduced there (Note [Global grad norm]). nullptr: the tensor is whole on this rank.
  Comm* comm = nullptr;
  std::string name = {};  // the unit, for messages
};

struct OptimizerConfig {
  std::string kind = "adamw";  // adamw | sgd
  AdamWConfig adamw;           // adamw.lr is the lr when the caller gives none (begin_step)
  float sgd_lr = 1e-2f, sgd_momentum = 0.9f, sgd_weight_decay = 0.0f;
  float max_grad_norm = 0;     // > 0: clip by the global grad norm (step() after backward only)
  float base_lr() const { return kind == "adamw" ? adamw.lr : sgd_lr; }
};

// Note [Global grad norm]
// Each rank's grad shards hold disjoint slices of the full grads (padding is zero), so the
// squared global norm is the sum over ranks of each rank's shard sums. Device::sum_squares
// writes one partial sum per tensor, grouped by mesh; one all-reduce per mesh (on that mesh's
// communicator: a group shards over exactly one mesh, so nothing is counted twice) makes every
// entry that tensor's full squared norm. The optimizer kernels add the entries and clip; the
// trainer copies the same entries to the host to print the norm and to name a unit whose grad
// is not finite.
class OptimizerInForward;
class OptimizerOffload;

// Where the optimizer's state lives: device memory, or (the optimizer offload, fsdp/
// optim_offload.h) host memory from Device::alloc_host, zero-filled, whose steps
// OptimizerOffload runs on the host; step() and step_one() then refuse.
enum class StatePlacement : uint8_t { Device, Host };

class Optimizer {
 public:
  Optimizer(Device& device, Stream stream, std::vector<ParamSpan> params, OptimizerConfig config,
            StatePlacement placement = StatePlacement::Device);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Writes the next step's scalars (lr, bias corrections, clip bound) to device memory, on s,
  // without a host sync. step() and step_one() of that step read them when they run.
  void begin_step(Stream s, float lr);
  // Note [Early grad norm] (fsdp.h): tensor `index`'s sum of squares, on s, once its grad is
  // final for the step. Optional; compute_grad_squares sums the rest.
  // `grad` becomes the tensor's grad (the shard this step reads: Note [Grads set to none]).
  void add_grad_square(Stream s, int index, const float* grad);
  // Note [Grads set to none] (fsdp.h): the grads the step reads, one per tensor in order
  // (ignored for a tensor made without one); each must be non-null where the tensor has one.
  void rebind_grads(const std::vector<float*>& grads);
  // Sums of squares of every grad not summed early this step, then all-reduced per mesh
  // (Note [Global grad norm]).
  void compute_grad_squares(Stream s);
  // The whole step after backward; clips when max_grad_norm > 0 (compute_grad_squares first).
  // Without begin_step, the step uses config.base_lr().
  void step(Stream s);
  // One tensor's step with the given grad, fp32 or bf16 (Note [Optimizer in backward]); no
  // clipping.
  void step_one(Stream s, int index, const void* grad, DType grad_dtype = DType::F32);
  // The step split into one part per tensor, each run later: OptimizerInForward (below).
  void zero_grad(Stream s);

  int64_t state_bytes() const;
  int64_t step_count() const { return step_; }
  // Device memory: one squared norm per tensor, in the order of grad_square_names().
  const float* grad_squares() const { return grad_sq_; }
  const std::vector<std::string>& grad_square_names() const { return sq_names_; }
  // For checkpoints: each tensor's state buffers (state0/state1), the config, and the step
  // count that the next begin_step() continues from (a resume sets it between steps).
  const std::vector<OptimTensor>& tensors() const { return tensors_; }
  const OptimizerConfig& config() const { return config_; }
  void set_step_count(int64_t steps);
  StatePlacement placement() const { return placement_; }
  // The begun step's scalars as begin_step wrote them to the device (the host's copy).
  const StepScalars& host_scalars() const { return host_scalars_; }

 private:
  // Closes a step and runs its parts (Note [Optimizer in forward's owner]).
  friend class OptimizerInForward;
  friend class OptimizerOffload;
  void launch(Stream s, const OptimTensor* t, int count, const StepScalars* scalars,
              GradSquares sq);
  void end_step();  // step() and OptimizerInForward::defer: the begun step is closed
  void set_grad(int index, const float* grad);

  Device& device_;
  OptimizerConfig config_;
  StatePlacement placement_;
  StepScalars host_scalars_;
  std::vector<OptimTensor> tensors_;
  std::vector<float*> state_;
  // Per mesh: the tensors whose shards live there, and where their sums go in grad_sq_.
  struct MeshTensors {
    Comm* comm = nullptr;
    int first = 0;  // index into grad_sq_
    std::vector<const float*> grads;
    std::vector<int64_t> numels;
    std::vector<int> tensors;  // their indices in tensors_
  };
  std::vector<MeshTensors> meshes_;
  std::vector<std::string> sq_names_;
  float* grad_sq_ = nullptr;         // device, one per tensor
  StepScalars* scalars_ = nullptr;   // device
  bool grad_sq_valid_ = false;       // computed for the current step
  std::vector<int> slot_of_;         // per tensor: its entry in grad_sq_ (-1: no grad)
  std::vector<bool> squared_early_;  // per tensor: add_grad_square ran this step
  int64_t step_ = 0;                 // steps begun
  bool begun_ = false;               // begin_step called for the next step
};

// Note [Optimizer in forward's owner]
// The optimizer in forward (Note [Optimizer in forward], fsdp.h) keeps all its state here: the
// step it closed (the step's scalars and grad sums, copied aside so the next step's
// begin_step and early sums cannot change them), which groups' parts of that step are still
// pending, the event and stream a part waits for, and the streams parts ran on. A group is one
// tensor of the Optimizer: group ordinal i (its index in sharded_groups(root)) is tensor i.
// The calls go one way, down; nothing calls back up:
//   the trainer makes it beside its Optimizer, hands it to the root before the first forward
//   (FsdpModule::set_optimizer_in_forward), and after each backward's clipping sums calls
//   FsdpModule::defer_shard_updates;
//   the core (src/core) keeps a pointer in its CommContext and calls in at its schedule
//   points: FsdpState::defer_updates -> defer(s, may_wait); FsdpState::root_pre_forward ->
//   forward_begins(compute); ParamGroup::unshard, just before the group's all-gather ->
//   run(all-gather stream, group, the all-gather's input); the next backward's first hook and
//   apply_pending_shard_updates (FsdpState::apply_pending_updates) -> run_all(s);
//   this class runs the Optimizer's kernels (one launch per part) on the Device.
class OptimizerInForward {
 public:
  // Device memory for one step's scalars and sums, on `stream`; `optimizer` must outlive it.
  OptimizerInForward(Optimizer& optimizer, Stream stream);
  ~OptimizerInForward();
  OptimizerInForward(const OptimizerInForward&) = delete;
  OptimizerInForward& operator=(const OptimizerInForward&) = delete;

  // Closes the optimizer's begun step as Optimizer::step does (clipping needs
  // compute_grad_squares first) but updates nothing: on s its scalars and sums are copied
  // aside. Group g's part is then pending, after the work issued on s, where may_wait[g];
  // the others run now, on s. Every part must have run before the next defer.
  void defer(Stream s, const std::vector<bool>& may_wait);
  // A forward begins on `compute`, after the deferral: a part run on another stream from now
  // waits for compute's position here (inside a captured step, a capture's own event).
  void forward_begins(Stream compute);
  // Runs group's pending part on s, writing the new param also to param_copy (rounded to
  // copy_dtype) when given. On another stream than the deferral's (or the forward's), s
  // waits for that first.
  void run(Stream s, int group, void* param_copy = nullptr, DType copy_dtype = DType::F32);
  // Runs every pending part on s; s then also follows the parts that ran on other streams.
  void run_all(Stream s);

  bool pending(int group) const { return pending_.at(static_cast<size_t>(group)); }
  int pending_count() const { return pending_count_; }
  // Whether the pending parts are exactly those the last defer left (nothing ran one since):
  // a captured step starts so (Note [Captured steps]).
  bool pending_as_deferred() const { return pending_count_ == left_by_defer_; }
  int64_t parts_run() const { return parts_run_; }  // every part run so far

 private:
  void launch_part(Stream s, int group, void* param_copy, DType copy_dtype);

  Optimizer& optimizer_;
  Device& device_;
  StepScalars* scalars_ = nullptr;  // device: the closed step's
  float* sums_ = nullptr;           // device: its grad sums
  int sum_count_ = 0;               // how many sums its parts clip by (0: no clipping)
  std::vector<bool> pending_;       // per group
  int pending_count_ = 0;
  int left_by_defer_ = 0;
  int64_t parts_run_ = 0;
  Event ready_;         // recorded on ready_stream_ at the deferral and at forward_begins
  Stream ready_stream_;
  Event joined_;        // run_all's join with the streams in ran_elsewhere_
  std::vector<Stream> ran_elsewhere_;  // streams parts ran on, besides ready_stream_, since run_all
};

}  // namespace fsdp::optim
