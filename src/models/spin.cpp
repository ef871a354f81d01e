// Family "spin": L x SpinBlock, blocks whose forward and backward take a forced time on the
// device (--spin-forward-us, --spin-backward-us) and compute nothing: schedule studies on the
// virtual clock, where only the order and the overlap of the work matter.
#include "fsdp/nn/layers.h"
#include "models/model_family.h"

namespace fsdp::models {

struct SpinFamily final : ModelFamily {
  SpinFamily() : ModelFamily("spin", "L x a block of forced forward and backward durations (schedule studies)") {}
  void resolve(nn::ModelConfig& c) const override {
    FSDP_USER_CHECK(c.spin_forward_us >= 0 && c.spin_backward_us >= 0,
                    "spin durations must be >= 0");
  }
  void build(nn::Model& root) const override {
    const nn::ModelConfig& c = root.config();
    add_blocks(root, [&](int, uint64_t) {
      return std::make_unique<nn::SpinBlock>(c.dim, c.spin_forward_us, c.spin_backward_us);
    });
    add_classification_head(root);
  }
  double saved_bytes_per_token(const nn::ModelConfig&, DType) const override { return 0; }
};

const ModelFamily& spin_family() {
  static const SpinFamily family;
  return family;
}

}  // namespace fsdp::models
