// The models the CLI and tests train, their synthetic data and losses.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/nn/layers.h"

namespace fsdp::nn {

struct ModelConfig {
  // mlp: L x (Linear(D,D) + ReLU); resmlp: L x ResidualMlp(GELU) + head; moe: L x MoeBlock + head;
  // spin: L x SpinBlock (forced durations, for schedule studies)
  std::string kind = "mlp";
  int layers = 4;
  int64_t dim = 64;
  int64_t hidden = 0;   // expert hidden size (0: dim)
  int experts = 4;
  int64_t classes = 0;  // >0: a head Linear(D, classes) on the root and cross-entropy loss
  MoeGradOrder grad_order = MoeGradOrder::DenseFirst;
  double spin_forward_us = 1000, spin_backward_us = 1000;  // kind "spin": SpinBlock durations
  uint64_t seed = 1;
};

// The root module: blocks "layers.i", then an optional "head".
class Model : public Module {
 public:
  explicit Model(const ModelConfig& config);
  const ModelConfig& config() const { return config_; }
  const std::vector<Module*>& blocks() const { return blocks_; }
  bool uses_cross_entropy() const { return config_.classes > 0; }
  int64_t output_dim() const { return config_.classes > 0 ? config_.classes : config_.dim; }
  int64_t param_count();

 protected:
  Tensor forward_impl(RunContext& ctx, const Tensor& x) override;
  Tensor backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) override;

 private:
  ModelConfig config_;
  std::vector<Module*> blocks_;
  Module* head_ = nullptr;
};

// Training data: row r of the global batch of a step is Uniform(-sqrt 3, sqrt 3) (unit
// variance) from include/fsdp/synthetic.h, made on the device by Device::synthetic_batch.
// Every row depends only on (seed, step, global row), so a single-rank reference can rebuild
// the global batch that the ranks share.
constexpr float kDataBound = 1.7320508f;

// Labels of rows [first_row, first_row + tokens) when the model has classes: the argmax of
// the row's first `classes` features (a target a linear head can learn).
std::vector<int32_t> make_labels(const ModelConfig& config, uint64_t seed, int step,
                                 int64_t first_row, int64_t tokens);

}  // namespace fsdp::nn
