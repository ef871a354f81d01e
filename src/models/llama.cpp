// Family "transformer": the Llama-style decoder of docs/transformer.md on token ids:
// tok_embeddings, L x TransformerBlock (RMSNorm, GQA attention with RoPE, RMSNorm, SwiGLU),
// norm, and the head "output", with cross-entropy. Its param names and its Hugging Face
// names are Llama's (docs/checkpoint.md).
#include "fsdp/nn/layers.h"
#include "fsdp/nn/transformer.h"
#include "models/llama_parts.h"
#include "models/model_family.h"

namespace fsdp::models {

void resolve_decoder(nn::ModelConfig& c) {
  nn::transformer_config(c);  // one-line errors for bad sizes (heads, kv heads, head_dim, ...)
}

void add_decoder_embedding(nn::Model& root, const nn::TransformerConfig& c) {
  root.set_embedding("tok_embeddings",
                     std::make_unique<nn::Embedding>(
                         c.vocab, c.dim,
                         nn::transformer_param_seed(c.seed, -1, nn::InitRole::Embedding)));
}

// Parameter order, as FSDP flattens the root's group: tok_embeddings, norm, output.
void add_decoder_head(nn::Model& root, const nn::TransformerConfig& c) {
  root.set_final_norm("norm", std::make_unique<nn::RMSNorm>(c.dim, c.norm_eps));
  root.set_head("output",
                std::make_unique<nn::Linear>(
                    c.dim, c.vocab,
                    nn::normal_init_fn(nn::transformer_param_seed(c.seed, -1, nn::InitRole::Output),
                                       c.vocab * c.dim, nn::kTransformerInitStd)));
  root.set_output(c.vocab, /*cross_entropy=*/true);
}

double decoder_attention_flops_per_token(const nn::TransformerConfig& c) {
  // Attention's two score GEMMs, counted in full although the mask is causal (docs/transformer.md).
  return 12.0 * c.layers * static_cast<double>(c.heads * c.head_dim()) * static_cast<double>(c.seq_len);
}

double attention_saved_bytes_per_token(const nn::TransformerConfig& c, DType act) {
  // The attention norm's output (wqkv's input), wqkv's output and q/k after RoPE, the
  // attention output (wo's input) and its softmax statistics (fp32 per head), the residual
  // sum; the block's input is the block before's output.
  const double d = static_cast<double>(c.dim), hd = static_cast<double>(c.head_dim());
  const double qkv = static_cast<double>(c.heads + 2 * c.kv_heads) * hd;
  const double a = static_cast<double>(dtype_size(act));
  return (2 * d + 2 * qkv + static_cast<double>(c.heads) * hd) * a + static_cast<double>(c.heads) * 4;
}

double dense_block_saved_bytes_per_token(const nn::TransformerConfig& c, DType act) {
  // Attention's, then the FFN norm's output, w13's output (SwiGLU's input), SwiGLU's output
  // (w2's input), the block's output.
  const double d = static_cast<double>(c.dim), f = static_cast<double>(c.ffn_dim);
  return attention_saved_bytes_per_token(c, act) +
         (2 * d + 3 * f) * static_cast<double>(dtype_size(act));
}

double selective_dropped_bytes_per_token(const nn::TransformerConfig& c, double swiglu_width,
                                         DType act) {
  return (2 * static_cast<double>(c.dim) + swiglu_width) * static_cast<double>(dtype_size(act));
}

nlohmann::json decoder_shape_fields(const ModelFamily& f, const nn::ModelConfig& m) {
  nlohmann::json j = f.ModelFamily::shape_fields(m);
  j["heads"] = m.heads;
  j["kv_heads"] = m.kv_heads;
  j["ffn_dim"] = m.ffn_dim;
  j["vocab"] = m.vocab;
  j["seq_len"] = m.seq_len;
  return j;
}

struct LlamaFamily final : ModelFamily {
  LlamaFamily() : ModelFamily("transformer", "a Llama-style decoder (RMSNorm, GQA attention with RoPE, SwiGLU) on token ids") {}
  void resolve(nn::ModelConfig& c) const override { resolve_decoder(c); }
  void build(nn::Model& root) const override {
    const nn::TransformerConfig c = nn::transformer_config(root.config());
    add_decoder_embedding(root, c);
    for (int i = 0; i < c.layers; ++i) root.add_block(std::make_unique<nn::TransformerBlock>(c, i));
    add_decoder_head(root, c);
  }
  BatchKind batch_kind() const override { return BatchKind::Tokens; }
  bool width_scaled_lr() const override { return false; }
  double attention_flops_per_token(const nn::ModelConfig& m) const override {
    return decoder_attention_flops_per_token(nn::transformer_config(m));
  }
  double saved_bytes_per_token(const nn::ModelConfig& m, DType act) const override {
    return dense_block_saved_bytes_per_token(nn::transformer_config(m), act);
  }
  double block_saved_bytes_per_token(const nn::ModelConfig& m, int layer, DType act,
                                     ActivationCheckpoint mode) const override {
    if (mode != ActivationCheckpoint::Selective)
      return ModelFamily::block_saved_bytes_per_token(m, layer, act, mode);
    const nn::TransformerConfig c = nn::transformer_config(m);
    return dense_block_saved_bytes_per_token(c, act) -
           selective_dropped_bytes_per_token(c, static_cast<double>(c.ffn_dim), act);
  }
  std::string selective_checkpoint_refusal() const override { return {}; }
  nlohmann::json shape_fields(const nn::ModelConfig& m) const override {
    return decoder_shape_fields(*this, m);
  }
};

const ModelFamily& llama_family() {
  static const LlamaFamily family;
  return family;
}

}  // namespace fsdp::models
