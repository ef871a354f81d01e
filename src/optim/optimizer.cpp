#include "fsdp/optim.h"

#include <algorithm>
#include <functional>

#include "fsdp/error.h"

namespace fsdp::optim {

Optimizer::Optimizer(Device& device, Stream stream, std::vector<ParamSpan> params,
                     OptimizerConfig config)
    : device_(device), config_(std::move(config)) {
  FSDP_CHECK(config_.kind == "adamw" || config_.kind == "sgd", "unknown optimizer '",
             config_.kind, "' (expected adamw or sgd)");
  const int states = config_.kind == "adamw" ? 2 : 1;
  for (const ParamSpan& p : params) {
    OptimTensor t{p.param, p.grad, nullptr, nullptr, p.numel};
    for (int s = 0; s < states; ++s) {
      auto* buf = static_cast<float*>(
          device_.alloc(static_cast<size_t>(p.numel) * sizeof(float), stream, MemTag::ShardedState));
      device_.fill(stream, buf, DType::F32, p.numel, 0.0f);
      state_.push_back(buf);
      (s == 0 ? t.state0 : t.state1) = buf;
    }
    tensors_.push_back(t);
  }
  steps_.assign(tensors_.size(), 0);
}

Optimizer::~Optimizer() {
  synchronize_in_destructor(device_);
  for (float* p : state_) device_.free(p, Stream{0});
}

namespace {
void launch(Device& d, Stream s, const OptimTensor* t, int count, const OptimizerConfig& c,
            int64_t step) {
  if (c.kind == "adamw")
    d.adamw_step(s, t, count, c.adamw, step);
  else
    d.sgd_step(s, t, count, c.sgd_lr, c.sgd_momentum, c.sgd_weight_decay);
}
}  // namespace

void Optimizer::step(Stream s) {
  for (int64_t& n : steps_) ++n;
  FSDP_CHECK(std::adjacent_find(steps_.begin(), steps_.end(), std::not_equal_to<>()) == steps_.end(),
             "step() after step_one() left the tensors at different step counts");
  device_.set_label("optimizer");
  launch(device_, s, tensors_.data(), static_cast<int>(tensors_.size()), config_,
         steps_.empty() ? 0 : steps_[0]);
}

void Optimizer::step_one(Stream s, int index, const float* grad) {
  FSDP_CHECK(index >= 0 && index < static_cast<int>(tensors_.size()), "optimizer tensor ", index,
             " out of range (", tensors_.size(), " tensors)");
  OptimTensor t = tensors_[index];
  t.grad = grad;
  launch(device_, s, &t, 1, config_, ++steps_[index]);
}

void Optimizer::zero_grad(Stream s) {
  device_.set_label("zero_grad");
  for (const OptimTensor& t : tensors_)
    if (t.grad) device_.fill(s, const_cast<float*>(t.grad), DType::F32, t.numel, 0.0f);
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const OptimTensor& t : tensors_) n += t.numel * 4 * (t.state1 ? 2 : 1);
  return n;
}

}  // namespace fsdp::optim
