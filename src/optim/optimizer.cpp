#include "fsdp/optim.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fsdp/error.h"

namespace fsdp::optim {

Optimizer::Optimizer(Device& device, Stream stream, std::vector<ParamSpan> params,
                     OptimizerConfig config, StatePlacement placement)
    : device_(device), config_(std::move(config)), placement_(placement) {
  FSDP_CHECK(config_.kind == "adamw" || config_.kind == "sgd", "unknown optimizer '",
             config_.kind, "' (expected adamw or sgd)");
  const int states = config_.kind == "adamw" ? 2 : 1;
  for (const ParamSpan& p : params) {
    OptimTensor t{p.param, p.grad, nullptr, nullptr, p.numel};
    for (int s = 0; s < states; ++s) {
      const size_t bytes = static_cast<size_t>(p.numel) * sizeof(float);
      float* buf = nullptr;
      if (placement_ == StatePlacement::Host) {
        buf = static_cast<float*>(device_.alloc_host(bytes));
        // A simulated device's host memory starts zeroed and is never touched (Note
        // [Host-side stream work]).
        if (device_.computes_values()) std::memset(buf, 0, bytes);
      } else {
        buf = static_cast<float*>(device_.alloc(bytes, stream, MemTag::ShardedState));
        device_.fill(stream, buf, DType::F32, p.numel, 0.0f);
      }
      state_.push_back(buf);
      (s == 0 ? t.state0 : t.state1) = buf;
    }
    tensors_.push_back(t);
  }
  // Group the tensors by mesh, in order of first appearance, so each mesh's sums are one
  // contiguous run of grad_sq_ (one all-reduce per mesh).
  for (const ParamSpan& p : params) {
    if (!p.grad) continue;
    MeshTensors* m = nullptr;
    for (MeshTensors& candidate : meshes_)
      if (candidate.comm == p.comm) m = &candidate;
    if (!m) m = &meshes_.emplace_back(MeshTensors{p.comm, 0, {}, {}, {}});
    m->grads.push_back(p.grad);
    m->numels.push_back(p.numel);
    m->tensors.push_back(static_cast<int>(&p - params.data()));
  }
  int next = 0;
  slot_of_.assign(params.size(), -1);
  squared_early_.assign(params.size(), false);
  for (MeshTensors& m : meshes_) {
    m.first = next;
    for (int t : m.tensors) {
      slot_of_[t] = next++;
      sq_names_.push_back(params[t].name);
    }
  }
  grad_sq_ = static_cast<float*>(
      device_.alloc(static_cast<size_t>(std::max(next, 1)) * sizeof(float), stream, MemTag::Other));
  device_.fill(stream, grad_sq_, DType::F32, std::max(next, 1), 0.0f);
  scalars_ = static_cast<StepScalars*>(device_.alloc(sizeof(StepScalars), stream, MemTag::Other));
}

Optimizer::~Optimizer() {
  synchronize_in_destructor(device_);
  for (float* p : state_)
    if (placement_ == StatePlacement::Host)
      device_.free_host(p);
    else
      device_.free(p, Stream{0});
  device_.free(grad_sq_, Stream{0});
  device_.free(scalars_, Stream{0});
}

void Optimizer::begin_step(Stream s, float lr) {
  ++step_;
  begun_ = true;
  grad_sq_valid_ = false;
  squared_early_.assign(squared_early_.size(), false);
  StepScalars v;
  v.lr = lr;
  if (config_.kind == "adamw") {
    // Bias corrections in double, as PyTorch computes them in Python floats.
    const double n = static_cast<double>(step_);
    v.bias_correction1 = static_cast<float>(1.0 - std::pow(double{config_.adamw.beta1}, n));
    v.bias_correction2_sqrt =
        static_cast<float>(std::sqrt(1.0 - std::pow(double{config_.adamw.beta2}, n)));
  }
  v.max_grad_norm = config_.max_grad_norm;
  host_scalars_ = v;
  device_.set_label("optimizer scalars");
  device_.copy_from_host(s, scalars_, &v, sizeof(v));
}

void Optimizer::set_step_count(int64_t steps) {
  FSDP_CHECK(!begun_, "set_step_count() between steps only");
  FSDP_CHECK(steps >= 0, "negative optimizer step count ", steps);
  step_ = steps;
}

void Optimizer::add_grad_square(Stream s, int index, const float* grad) {
  FSDP_CHECK(index >= 0 && index < static_cast<int>(tensors_.size()) && slot_of_[index] >= 0,
             "optimizer tensor ", index, " has no grad to square");
  set_grad(index, grad);
  device_.set_label("grad norm");
  device_.sum_squares(s, &grad, &tensors_[index].numel, 1, grad_sq_ + slot_of_[index]);
  squared_early_[index] = true;
}

void Optimizer::set_grad(int index, const float* grad) {
  FSDP_CHECK(grad, "optimizer tensor ", index, " has a null grad");
  tensors_[static_cast<size_t>(index)].grad = grad;
  for (MeshTensors& m : meshes_)
    for (size_t i = 0; i < m.tensors.size(); ++i)
      if (m.tensors[i] == index) m.grads[i] = grad;
}

void Optimizer::rebind_grads(const std::vector<float*>& grads) {
  FSDP_CHECK(grads.size() == tensors_.size(), "rebind_grads got ", grads.size(),
             " grads for ", tensors_.size(), " optimizer tensors");
  for (size_t i = 0; i < grads.size(); ++i)
    if (slot_of_[i] >= 0) set_grad(static_cast<int>(i), grads[i]);
}

void Optimizer::compute_grad_squares(Stream s) {
  device_.set_label("grad norm");
  for (const MeshTensors& m : meshes_) {
    float* out = grad_sq_ + m.first;
    const int count = static_cast<int>(m.grads.size());
    // Each tensor's sum is its own tiles' (the kernel never mixes tensors), so a sum made
    // early and one made here in the whole list are the same bits.
    const bool any_early = std::any_of(m.tensors.begin(), m.tensors.end(),
                                       [&](int t) { return squared_early_[t]; });
    if (!any_early) {
      device_.sum_squares(s, m.grads.data(), m.numels.data(), count, out);
    } else {
      for (int i = 0; i < count; ++i)
        if (!squared_early_[m.tensors[i]])
          device_.sum_squares(s, &m.grads[i], &m.numels[i], 1, out + i);
    }
    if (m.comm && m.comm->size() > 1)
      m.comm->all_reduce(out, out, count, DType::F32, ReduceOp::Sum, s);
  }
  grad_sq_valid_ = true;
  squared_early_.assign(squared_early_.size(), false);  // consumed
}

void Optimizer::launch(Stream s, const OptimTensor* t, int count, const StepScalars* scalars,
                       GradSquares sq) {
  device_.set_label("optimizer");
  if (config_.kind == "adamw")
    device_.adamw_step_scalars(s, t, count, config_.adamw, scalars, sq);
  else
    device_.sgd_step_scalars(s, t, count, config_.sgd_momentum, config_.sgd_weight_decay,
                             scalars, sq);
}

void Optimizer::end_step() {
  begun_ = false;
  FSDP_CHECK(config_.max_grad_norm <= 0 || grad_sq_valid_,
             "clipping needs compute_grad_squares() before the step");
}

void Optimizer::step(Stream s) {
  FSDP_CHECK(placement_ == StatePlacement::Device,
             "the optimizer's state is on the host: OptimizerOffload::step runs its step");
  if (!begun_) begin_step(s, config_.base_lr());
  end_step();
  GradSquares sq{grad_sq_, grad_sq_valid_ ? static_cast<int>(sq_names_.size()) : 0};
  launch(s, tensors_.data(), static_cast<int>(tensors_.size()), scalars_, sq);
}

void Optimizer::step_one(Stream s, int index, const void* grad, DType grad_dtype) {
  FSDP_CHECK(index >= 0 && index < static_cast<int>(tensors_.size()), "optimizer tensor ", index,
             " out of range (", tensors_.size(), " tensors)");
  FSDP_CHECK(begun_, "step_one() needs begin_step() first");
  FSDP_CHECK(placement_ == StatePlacement::Device,
             "the optimizer's state is on the host: it cannot step in backward");
  FSDP_CHECK(config_.max_grad_norm <= 0,
             "the optimizer in backward cannot clip gradients: clipping needs every grad first");
  OptimTensor t = tensors_[index];
  t.grad = grad;
  t.grad_dtype = grad_dtype;
  launch(s, &t, 1, scalars_, GradSquares{});
}

void Optimizer::zero_grad(Stream s) {
  device_.set_label("zero_grad");
  for (const OptimTensor& t : tensors_)
    if (t.grad) device_.fill(s, const_cast<void*>(t.grad), DType::F32, t.numel, 0.0f);
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const OptimTensor& t : tensors_) n += t.numel * 4 * (t.state1 ? 2 : 1);
  return n;
}

}  // namespace fsdp::optim
