// Family "moe": L x MoeBlock (a softmax router over E dense experts, every token through every
// expert, weighted), and an optional head. Its experts' params shard over a mesh of their own
// by default: the shape of MoE models, where dense weights and experts live on different
// meshes, on the smallest model that shows it.
#include "fsdp/nn/layers.h"
#include "models/model_family.h"

namespace fsdp::models {

struct MoeFamily final : ModelFamily {
  MoeFamily() : ModelFamily("moe", "L x dense mixture-of-experts blocks (router + E GELU experts), an optional head") {}
  void resolve(nn::ModelConfig& c) const override {
    FSDP_OPTION_CHECK(c.experts >= 1, OptionName{"experts"}, " must be >= 1, got ", c.experts);
    FSDP_OPTION_CHECK(c.hidden >= 0, OptionName{"hidden"}, " must be >= 0 (0: dim), got ",
                      c.hidden);
  }
  static int64_t hidden(const nn::ModelConfig& c) { return c.hidden ? c.hidden : c.dim; }
  void build(nn::Model& root) const override {
    const nn::ModelConfig& c = root.config();
    add_blocks(root, [&](int, uint64_t seed) {
      return std::make_unique<nn::MoeBlock>(c.dim, hidden(c), c.experts, c.grad_order, seed, c.norm);
    });
    add_classification_head(root);
  }
  FsdpModule& parallelize(nn::Model& model, ParallelizeContext& ctx) const override {
    if (ctx.experts_on_own_mesh) {
      ctx.expert_mesh =
          ctx.make_mesh("experts", ctx.hsdp ? nullptr : ctx.world.split(0, ctx.world.rank(), "experts"));
      Mesh* em = ctx.expert_mesh.get();
      ctx.options.shard_placement_fn = [em](const Module& owner, const Param&) -> Mesh* {
        return nn::MoeBlock::is_expert_param(owner) ? em : nullptr;
      };
    }
    return ModelFamily::parallelize(model, ctx);
  }
  double saved_bytes_per_token(const nn::ModelConfig& c, DType act) const override {
    // Each expert's hidden pre- and post-activation and its output, the router's logits and
    // fp32 probabilities, the block's output, and with the norm its output.
    const double d = static_cast<double>(c.dim), h = static_cast<double>(hidden(c));
    const double e = static_cast<double>(c.experts), a = static_cast<double>(dtype_size(act));
    return (e * (2 * h + d) + e + d + (c.norm ? d : 0)) * a + e * 4;
  }
  double block_backward_bytes_per_token(const nn::ModelConfig& c, int, DType act) const override {
    // The experts' backward runs one expert at a time: the gradients of one expert's hidden
    // pre- and post-activation and its output, beside the three of the block's width.
    const double d = static_cast<double>(c.dim), h = static_cast<double>(hidden(c));
    return (2 * h + d + 3 * d) * static_cast<double>(dtype_size(act));
  }
};

const ModelFamily& moe_family() {
  static const MoeFamily family;
  return family;
}

}  // namespace fsdp::models
