// Family "mlp": L x (Linear(D, D, bias=False) + ReLU), the ReLU fused into the GEMM's epilogue,
// and an optional head Linear(D, classes) on the root. The plainest FSDP model: each block is
// one param, so schedules and counts are easy to read off it.
#include <cmath>

#include "fsdp/nn/layers.h"
#include "models/model_family.h"

namespace fsdp::models {

struct MlpFamily final : ModelFamily {
  MlpFamily() : ModelFamily("mlp", "L x (Linear(D, D) + ReLU), an optional classification head") {}
  void build(nn::Model& root) const override {
    const int64_t d = root.config().dim;
    // He init (variance 2 / D): a ReLU halves the second moment, so the signal keeps its
    // scale at any depth (with 1 / sqrt(D) it shrank 6x a layer and underflowed by 64).
    const float bound = std::sqrt(6.0f / static_cast<float>(d));
    add_blocks(root, [&](int, uint64_t seed) {
      auto linear = std::make_unique<nn::Linear>(d, d, nn::uniform_init_fn(seed, d * d, bound));
      linear->fused_relu = true;
      return linear;
    });
    add_classification_head(root);
  }
  double saved_bytes_per_token(const nn::ModelConfig& c, DType act) const override {
    // The GEMM's output (the ReLU's mask is read back from it); its input is the block
    // before's output.
    return static_cast<double>(c.dim) * static_cast<double>(dtype_size(act));
  }
};

void add_classification_head(nn::Model& root) {
  const nn::ModelConfig& c = root.config();
  if (c.classes > 0)
    root.set_head("head", std::make_unique<nn::Linear>(c.dim, c.classes, true, c.seed * 31 + 5));
  root.set_output(c.classes > 0 ? c.classes : c.dim, c.classes > 0);
}

const ModelFamily& mlp_family() {
  static const MlpFamily family;
  return family;
}

}  // namespace fsdp::models
