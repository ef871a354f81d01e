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
class Optimizer {
 public:
  Optimizer(Device& device, Stream stream, std::vector<ParamSpan> params, OptimizerConfig config);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Writes the next step's scalars (lr, bias corrections, clip bound) to device memory, on s,
  // without a host sync. step() and step_one() of that step read them when they run.
  void begin_step(Stream s, float lr);
  // Note [Early grad norm] (fsdp.h): tensor `index`'s sum of squares, on s, once its grad is
  // final for the step. Optional; compute_grad_squares sums the rest.
  // `grad` must be the tensor's grad (the shard the optimizer reads).
  void add_grad_square(Stream s, int index, const float* grad);
  // Sums of squares of every grad not summed early this step, then all-reduced per mesh
  // (Note [Global grad norm]).
  void compute_grad_squares(Stream s);
  // The whole step after backward; clips when max_grad_norm > 0 (compute_grad_squares first).
  // Without begin_step, the step uses config.base_lr().
  void step(Stream s);
  // One tensor's step with the given grad, fp32 or bf16 (Note [Optimizer in backward]); no
  // clipping.
  void step_one(Stream s, int index, const void* grad, DType grad_dtype = DType::F32);
  // Note [Optimizer in forward] (fsdp.h): the step, split so each tensor's part runs later.
  // defer_step closes the step like step() (clipping needs compute_grad_squares first) but
  // updates nothing: on s it copies the step's scalars and grad sums aside, where they stay
  // until the next defer_step. step_deferred then runs tensor `index`'s part of that step on
  // any stream ordered after it, writing the new param also into param_copy (rounded to
  // copy_dtype) when given. Every tensor's part must run before the next defer_step.
  void defer_step(Stream s);
  void step_deferred(Stream s, int index, void* param_copy = nullptr,
                     DType copy_dtype = DType::F32);
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

 private:
  void launch(Stream s, const OptimTensor* t, int count, const StepScalars* scalars,
              GradSquares sq);
  void end_step();  // step() and defer_step(): the begun step is closed

  Device& device_;
  OptimizerConfig config_;
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
  // Note [Optimizer in forward]: the deferred step's scalars and sums (device), and how many
  // sums it clips by (0: no clipping); deferred_ once defer_step has run.
  StepScalars* deferred_scalars_ = nullptr;
  float* deferred_sq_ = nullptr;
  int deferred_sq_count_ = 0;
  bool deferred_ = false;
  bool grad_sq_valid_ = false;       // computed for the current step
  std::vector<int> slot_of_;         // per tensor: its entry in grad_sq_ (-1: no grad)
  std::vector<bool> squared_early_;  // per tensor: add_grad_square ran this step
  int64_t step_ = 0;                 // steps begun
  bool begun_ = false;               // begin_step called for the next step
};

}  // namespace fsdp::optim
