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
  void zero_grad(Stream s);
  int64_t state_bytes() const;

 private:
  Device& device_;
  OptimizerConfig config_;
  std::vector<OptimTensor> tensors_;
  std::vector<float*> state_;
  int64_t step_ = 0;
};

}  // namespace fsdp::optim
