#include "optim/optimizer.h"

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
}

Optimizer::~Optimizer() {
  synchronize_in_destructor(device_);
  for (float* p : state_) device_.free(p, Stream{0});
}

void Optimizer::step(Stream s) {
  ++step_;
  device_.set_label("optimizer");
  if (config_.kind == "adamw")
    device_.adamw_step(s, tensors_.data(), static_cast<int>(tensors_.size()), config_.adamw, step_);
  else
    device_.sgd_step(s, tensors_.data(), static_cast<int>(tensors_.size()), config_.sgd_lr,
                     config_.sgd_momentum, config_.sgd_weight_decay);
}

void Optimizer::zero_grad(Stream s) {
  device_.set_label("zero_grad");
  for (const OptimTensor& t : tensors_)
    device_.fill(s, const_cast<float*>(t.grad), DType::F32, t.numel, 0.0f);
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const OptimTensor& t : tensors_) n += t.numel * 4 * (t.state1 ? 2 : 1);
  return n;
}

}  // namespace fsdp::optim
