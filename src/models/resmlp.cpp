// Family "resmlp": L x ResidualMlp (x + fc2(GELU(fc1(norm(x)))), biases on), and an optional
// classification head. The pre-norm (--norm) keeps the residual stream's growth out of the
// branch.
#include "fsdp/nn/layers.h"
#include "models/model_family.h"

namespace fsdp::models {

struct ResMlpFamily final : ModelFamily {
  ResMlpFamily() : ModelFamily("resmlp", "L x residual MLP blocks (fc1, GELU, fc2; hidden 4 x D), an optional head") {}
  void resolve(nn::ModelConfig& c) const override {
    FSDP_OPTION_CHECK(c.hidden >= 0, OptionName{"hidden"}, " must be >= 0 (0: 4 x dim), got ",
                      c.hidden);
  }
  static int64_t hidden(const nn::ModelConfig& c) { return c.hidden ? c.hidden : 4 * c.dim; }
  void build(nn::Model& root) const override {
    const nn::ModelConfig& c = root.config();
    add_blocks(root, [&](int, uint64_t seed) {
      return std::make_unique<nn::ResidualMlp>(c.dim, hidden(c), Activation::GELU, seed, c.norm);
    });
    add_classification_head(root);
  }
  double saved_bytes_per_token(const nn::ModelConfig& c, DType act) const override {
    // fc1's output (GELU's input), GELU's output (fc2's input), the block's output, and with
    // the norm its output (fc1's input); the block's input is the block before's output.
    const double d = static_cast<double>(c.dim), h = static_cast<double>(hidden(c));
    return (2 * h + d + (c.norm ? d : 0)) * static_cast<double>(dtype_size(act));
  }
};

const ModelFamily& resmlp_family() {
  static const ResMlpFamily family;
  return family;
}

}  // namespace fsdp::models
