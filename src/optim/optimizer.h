// AdamW and SGD over fp32 shards: one multi-tensor launch per step.
#pragma once

#include <string>
#include <vector>

#include "fsdp/device.h"

namespace fsdp::optim {

struct ParamSpan {
  float* param = nullptr;
  float* grad = nullptr;
  int64_t numel = 0;
};

struct OptimizerConfig {
  std::string kind = "adamw";  // adamw | sgd
  AdamWConfig adamw;
  float sgd_lr = 1e-2f, sgd_momentum = 0.9f, sgd_weight_decay = 0.0f;
};

class Optimizer {
 public:
  Optimizer(Device& device, Stream stream, std::vector<ParamSpan> params, OptimizerConfig config);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  void step(Stream s);
  // One tensor's step with the given grad (Note [Optimizer in backward]): its own step count.
  void step_one(Stream s, int index, const float* grad);
  void zero_grad(Stream s);
  int64_t state_bytes() const;
  // For checkpoints: each tensor's buffers (state0/state1) and its step count.
  const std::vector<OptimTensor>& tensors() const { return tensors_; }
  std::vector<int64_t>& step_counts() { return steps_; }
  const OptimizerConfig& config() const { return config_; }

 private:
  Device& device_;
  OptimizerConfig config_;
  std::vector<OptimTensor> tensors_;
  std::vector<float*> state_;
  std::vector<int64_t> steps_;  // per tensor
};

}  // namespace fsdp::optim
