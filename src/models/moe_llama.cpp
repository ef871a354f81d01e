// Family "moe-transformer": the transformer of llama.cpp with a mixture-of-experts
// feed-forward (MoeFeedForward: a top-k router, SwiGLU GroupedExperts, all-to-all dispatch
// over --ep ranks) in every --moe-every-th block (docs/moe.md). The experts shard over the
// "efsdp" mesh (the ranks with the same ep rank), the rest over the whole world.
#include "fsdp/nn/layers.h"
#include "fsdp/nn/moe.h"
#include "models/llama_parts.h"
#include "models/model_family.h"

namespace fsdp::models {

static bool is_experts(const Module& owner) {
  return dynamic_cast<const nn::GroupedExperts*>(&owner) != nullptr;
}

struct MoeLlamaFamily final : ModelFamily {
  MoeLlamaFamily() : ModelFamily("moe-transformer", "the transformer with a top-k mixture-of-experts FFN in every other block, ep ranks") {}
  void resolve(nn::ModelConfig& c) const override {
    resolve_decoder(c);
    FSDP_OPTION_CHECK(c.ep >= 1, OptionName{"ep"}, " must be >= 1, got ", c.ep);
    nn::moe_config(c);  // one-line errors (experts divisible by ep, top-k, ...)
  }
  void build(nn::Model& root) const override {
    const nn::ModelConfig& config = root.config();
    const nn::TransformerConfig c = nn::transformer_config(config);
    const nn::MoeConfig m = nn::moe_config(config);
    add_decoder_embedding(root, c);
    int moe_index = 0;
    for (int i = 0; i < c.layers; ++i) {
      if (!nn::is_moe_layer(i, config.moe_every)) {
        root.add_block(std::make_unique<nn::TransformerBlock>(c, i));
        continue;
      }
      auto block = std::make_unique<nn::MoeTransformerBlock>(c, m, i);
      // Which of the block's two param groups gets all its grads first (tests use every order).
      const nn::MoeGradOrder order = config.expert_grad_order;
      const bool dense_first = order == nn::MoeGradOrder::DenseFirst ||
                               (order == nn::MoeGradOrder::Interleaved && moe_index % 2 == 1);
      block->moe().experts().hold_grads = dense_first || order == nn::MoeGradOrder::ExpertsDeferred;
      block->defer_expert_grads_to_root = order == nn::MoeGradOrder::ExpertsDeferred;
      ++moe_index;
      root.add_block(std::move(block));
    }
    add_decoder_head(root, c);
  }
  BatchKind batch_kind() const override { return BatchKind::Tokens; }
  bool width_scaled_lr() const override { return false; }
  int expert_parallel_size(const nn::ModelConfig& c) const override { return c.ep; }
  FsdpModule& parallelize(nn::Model& model, ParallelizeContext& ctx) const override {
    const int ep = model.config().ep;
    const int rank = ctx.world.rank();
    ctx.expert_mesh =
        ctx.make_mesh("efsdp", ctx.hsdp ? nullptr : ctx.world.split(rank % ep, rank, "efsdp"));
    Mesh* em = ctx.expert_mesh.get();
    ctx.options.shard_placement_fn = [em](const Module& owner, const Param&) -> Mesh* {
      return is_experts(owner) ? em : nullptr;
    };
    FsdpModule& root = ModelFamily::parallelize(model, ctx);
    // Note [Gradient divide factor]: every group's grad is of the mean loss over all dp ranks.
    root.set_gradient_divide_factor(ctx.world.size());
    return root;
  }
  std::optional<OptionError> capture_refusal(const nn::ModelConfig& c) const override {
    if (c.capacity_factor > 0) return std::nullopt;
    return OptionError::of(
        OptionName{"cuda_graph"}, " cannot capture ", OptionName{"model"},
        " moe-transformer with dropless routing: its shapes depend on the data (each MoE layer "
        "reads its routing back to the host to size the experts' rows and the all-to-all), and "
        "a graph cannot wait for the host inside a step; ", OptionName{"capacity_factor"},
        " > 0 routes on the device and captures");
  }
  double attention_flops_per_token(const nn::ModelConfig& m) const override {
    return decoder_attention_flops_per_token(nn::transformer_config(m));
  }
  double saved_bytes_per_token(const nn::ModelConfig& config, DType act) const override {
    // The mean over blocks.
    double sum = 0;
    for (int i = 0; i < config.layers; ++i)
      sum += block_saved_bytes_per_token(config, i, act, ActivationCheckpoint::None);
    return sum / config.layers;
  }
  double block_fp8_saved_delta_per_token(const nn::ModelConfig& config, int layer, DType act,
                                         ActivationCheckpoint mode) const override {
    return decoder_fp8_saved_delta_per_token(nn::transformer_config(config),
                                             !nn::is_moe_layer(layer, config.moe_every), act, mode);
  }
  double block_saved_bytes_per_token(const nn::ModelConfig& config, int layer, DType act,
                                     ActivationCheckpoint mode) const override {
    if (mode == ActivationCheckpoint::Full)
      return ModelFamily::block_saved_bytes_per_token(config, layer, act, mode);
    // Dense blocks as the transformer's; MoE blocks keep the router's logits and
    // probabilities and, per routed copy of a token (K of them), the experts' input, w13's
    // output and SwiGLU's output.
    const nn::TransformerConfig c = nn::transformer_config(config);
    const nn::MoeConfig m = nn::moe_config(config);
    const bool moe_layer = nn::is_moe_layer(layer, config.moe_every);
    const double a = static_cast<double>(dtype_size(act)), d = static_cast<double>(c.dim);
    const double moe = 2 * d * a + 4 + 2 * m.experts * 4.0 +
                       m.top_k * (d + 3 * static_cast<double>(m.expert_ffn_dim)) * a + d * a;
    const double all = moe_layer ? attention_saved_bytes_per_token(c, act) + moe
                                 : dense_block_saved_bytes_per_token(c, act);
    if (mode == ActivationCheckpoint::None) return all;
    const double swiglu = moe_layer ? m.top_k * static_cast<double>(m.expert_ffn_dim)
                                    : static_cast<double>(c.ffn_dim);
    return all - selective_dropped_bytes_per_token(c, swiglu, act);
  }
  double block_backward_bytes_per_token(const nn::ModelConfig& config, int layer,
                                        DType act) const override {
    const bool moe_layer = nn::is_moe_layer(layer, config.moe_every);
    const nn::MoeConfig m = nn::moe_config(config);
    return swiglu_backward_bytes_per_token(
        moe_layer ? m.top_k * static_cast<double>(m.expert_ffn_dim)
                  : static_cast<double>(nn::transformer_config(config).ffn_dim),
        act);
  }
  std::string selective_checkpoint_refusal() const override { return {}; }
  nlohmann::json shape_fields(const nn::ModelConfig& m) const override {
    // Not ep: a checkpoint holds every expert (any ep loads it).
    nlohmann::json j = decoder_shape_fields(*this, m);
    j["expert_ffn_dim"] = m.expert_ffn_dim;
    j["moe_every"] = m.moe_every;
    return j;
  }
  void read_shape_fields(const nlohmann::json& j, nn::ModelConfig& m) const override {
    ModelFamily::read_shape_fields(j, m);
    read_decoder_shape_fields(j, m);
    m.expert_ffn_dim = j.value("expert_ffn_dim", m.expert_ffn_dim);
    m.moe_every = j.value("moe_every", m.moe_every);
  }
  checkpoint::HfNames hf_names(const nn::ModelConfig& m) const override {
    return decoder_hf_names(nn::transformer_config(m));
  }
  std::function<bool(const Module&)> expert_modules() const override { return is_experts; }
};

const ModelFamily& moe_llama_family() {
  static const MoeLlamaFamily family;
  return family;
}

}  // namespace fsdp::models
