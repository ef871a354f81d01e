// Family "transformer": the Llama-style decoder of docs/transformer.md on token ids:
// tok_embeddings, L x TransformerBlock (RMSNorm, GQA attention with RoPE, RMSNorm, SwiGLU),
// norm, and the head "output" (or the embedding's weight, tied), with cross-entropy. Its param
// names and its Hugging Face names are Llama's (docs/checkpoint.md); it reads the config.json
// of Llama, Qwen2 and Mistral models (llama_hf.cpp).
#include "fsdp/error.h"
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

// Parameter order, as FSDP flattens the root's group: tok_embeddings, norm, output (none when
// tied: the head uses tok_embeddings', Note [Tied embeddings]).
void add_decoder_head(nn::Model& root, const nn::TransformerConfig& c) {
  auto norm = std::make_unique<nn::RMSNorm>(c.dim, c.norm_eps);
  // Note [Fused amax]: a block's input gradient is the dY of the block before it's last
  // Linear, and the final norm's the last block's (the head, in bf16, reads nothing in fp8).
  const Param* reader = nullptr;
  for (Module* m : root.blocks()) {
    auto* block = dynamic_cast<nn::DecoderBlock*>(m);
    FSDP_CHECK(block, "a decoder's block '", m->fqn(), "' is not a decoder block");
    block->set_input_grad_reader(reader);
    reader = block->output_projection_weight();
  }
  norm->set_fp8_input_grad_reader(reader);
  root.set_final_norm("norm", std::move(norm));
  if (c.tie_embeddings)
    root.set_head("output", std::make_unique<nn::TiedHead>(
                                dynamic_cast<nn::Embedding&>(*root.embedding()).weight()));
  else
    root.set_head("output", std::make_unique<nn::Linear>(
                                c.dim, c.vocab,
                                nn::normal_init_fn(
                                    nn::transformer_param_seed(c.seed, -1, nn::InitRole::Output),
                                    c.vocab * c.dim, nn::kTransformerInitStd)));
  root.set_output(c.vocab, /*cross_entropy=*/true);
}

double decoder_attention_flops_per_token(const nn::TransformerConfig& c) {
  // Attention's two score GEMMs, counted in full although the mask is causal (docs/transformer.md).
  return 12.0 * c.layers * static_cast<double>(c.heads * c.head_dim()) * static_cast<double>(c.seq_len);
}

double attention_saved_bytes_per_token(const nn::TransformerConfig& c, DType act) {
  // The block's input (attention_norm's) and the norm's output (wqkv's input) and rstd (fp32),
  // wqkv's output (RoPE rotates its q and k in place: one copy), the attention output (wo's
  // input) and its softmax statistics (fp32 per head). The block's output is the next one's
  // input (the last block's, the final norm's).
  const double d = static_cast<double>(c.dim), hd = static_cast<double>(c.head_dim());
  const double qkv = static_cast<double>(c.heads + 2 * c.kv_heads) * hd;
  const double a = static_cast<double>(dtype_size(act));
  return (2 * d + qkv + static_cast<double>(c.heads) * hd) * a + static_cast<double>(c.heads) * 4 +
         4;
}

double dense_block_saved_bytes_per_token(const nn::TransformerConfig& c, DType act) {
  // Attention's, then the residual sum h (ffn_norm's input), the norm's output and rstd,
  // w13's output (SwiGLU's input), SwiGLU's output (w2's input): docs/memory.md's table.
  const double d = static_cast<double>(c.dim), f = static_cast<double>(c.ffn_dim);
  return attention_saved_bytes_per_token(c, act) +
         (2 * d + 3 * f) * static_cast<double>(dtype_size(act)) + 4;
}

double swiglu_backward_bytes_per_token(double swiglu_width, DType act) {
  // SwiGLU's backward holds the gradients of its output (w2's input) and of its input (w13's
  // output, twice as wide) at once.
  return 3 * swiglu_width * static_cast<double>(dtype_size(act));
}

double decoder_fp8_saved_delta_per_token(const nn::TransformerConfig& c, bool dense_ffn,
                                         DType act, ActivationCheckpoint mode) {
  if (mode == ActivationCheckpoint::Full) return 0;
  const double wo_codes = static_cast<double>(c.heads * c.head_dim());
  if (mode == ActivationCheckpoint::Selective) return wo_codes;  // the others were dropped
  const double d = static_cast<double>(c.dim), f = static_cast<double>(c.ffn_dim);
  const double replaced = d + (dense_ffn ? d + f : 0);
  return wo_codes - replaced * (static_cast<double>(dtype_size(act)) - 1);
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
  // The dialect's options (they change the math, some the shapes): only where they are not
  // the defaults, so a checkpoint of the plain transformer keeps the fields it had. A resume
  // compares the fields of both sides (checkpoint::check_compatible).
  const nn::ModelConfig plain;
  if (m.head_dim != plain.head_dim) j["head_dim"] = m.head_dim;
  if (m.rope_theta != plain.rope_theta) j["rope_theta"] = m.rope_theta;
  if (m.rope_scaling != plain.rope_scaling)
    j["rope_scaling"] = {{"type", m.rope_scaling.type},
                         {"factor", m.rope_scaling.factor},
                         {"low_freq_factor", m.rope_scaling.low_freq_factor},
                         {"high_freq_factor", m.rope_scaling.high_freq_factor},
                         {"original_max_positions", m.rope_scaling.original_max_positions}};
  if (m.norm_eps != plain.norm_eps) j["norm_eps"] = m.norm_eps;
  if (m.tie_embeddings) j["tie_embeddings"] = true;
  if (m.attention_bias) j["attention_bias"] = true;
  if (m.sliding_window != plain.sliding_window) j["sliding_window"] = m.sliding_window;
  return j;
}

void read_decoder_shape_fields(const nlohmann::json& j, nn::ModelConfig& m) {
  m.heads = j.value("heads", m.heads);
  m.kv_heads = j.value("kv_heads", m.kv_heads);
  m.ffn_dim = j.value("ffn_dim", m.ffn_dim);
  m.vocab = j.value("vocab", m.vocab);
  m.seq_len = j.value("seq_len", m.seq_len);
  m.head_dim = j.value("head_dim", m.head_dim);
  m.rope_theta = j.value("rope_theta", m.rope_theta);
  if (j.contains("rope_scaling")) {
    const nlohmann::json& r = j.at("rope_scaling");
    m.rope_scaling.type = r.value("type", m.rope_scaling.type);
    m.rope_scaling.factor = r.value("factor", m.rope_scaling.factor);
    m.rope_scaling.low_freq_factor = r.value("low_freq_factor", m.rope_scaling.low_freq_factor);
    m.rope_scaling.high_freq_factor = r.value("high_freq_factor", m.rope_scaling.high_freq_factor);
    m.rope_scaling.original_max_positions =
        r.value("original_max_positions", m.rope_scaling.original_max_positions);
  }
  m.norm_eps = j.value("norm_eps", m.norm_eps);
  m.tie_embeddings = j.value("tie_embeddings", m.tie_embeddings);
  m.attention_bias = j.value("attention_bias", m.attention_bias);
  m.sliding_window = j.value("sliding_window", m.sliding_window);
}

namespace {

// "layers.3.attention.wqkv.weight" -> (3, "attention.wqkv.weight"); -1 when not a layer name.
std::pair<long, std::string> split_layer(const std::string& fqn) {
  if (fqn.compare(0, 7, "layers.") != 0) return {-1, fqn};
  const size_t dot = fqn.find('.', 7);
  if (dot == std::string::npos || dot == 7) return {-1, fqn};
  long layer = 0;
  for (size_t i = 7; i < dot; ++i) {
    if (fqn[i] < '0' || fqn[i] > '9' || layer > (1L << 40)) return {-1, fqn};
    layer = layer * 10 + (fqn[i] - '0');
  }
  return {layer, fqn.substr(dot + 1)};
}

}  // namespace

// Hugging Face Llama's names (LlamaForCausalLM, and Qwen2's and Mistral's, which share them):
// wqkv's rows are q, k, v and w13's gate, up (Note [Transformer layout]).
checkpoint::HfNames decoder_hf_names(const nn::TransformerConfig& c) {
  const int64_t q_rows = c.heads * c.head_dim(), kv_rows = c.kv_heads * c.head_dim();
  return
      [q_rows, kv_rows](const std::string& fqn, int64_t rows) -> std::vector<checkpoint::HfTensor> {
        if (fqn == "tok_embeddings.weight") return {{"model.embed_tokens.weight", rows}};
        if (fqn == "norm.weight") return {{"model.norm.weight", rows}};
        if (fqn == "output.weight") return {{"lm_head.weight", rows}};
        const auto [layer, rest] = split_layer(fqn);
        if (layer < 0) return {};
        const std::string p = "model.layers." + std::to_string(layer) + ".";
        // The MoE layer (docs/moe.md) has no Llama name: its params keep their fqns.
        if (rest.starts_with("moe.")) return {{fqn, rows}};
        if (rest == "attention_norm.weight") return {{p + "input_layernorm.weight", rows}};
        if (rest == "ffn_norm.weight") return {{p + "post_attention_layernorm.weight", rows}};
        if (rest == "attention.wo.weight") return {{p + "self_attn.o_proj.weight", rows}};
        if (rest == "feed_forward.w2.weight") return {{p + "mlp.down_proj.weight", rows}};
        if (rest == "feed_forward.w13.weight")
          return {{p + "mlp.gate_proj.weight", rows / 2}, {p + "mlp.up_proj.weight", rows / 2}};
        for (const char* what : {"weight", "bias"})
          if (rest == std::string("attention.wqkv.") + what && rows == q_rows + 2 * kv_rows)
            return {{p + "self_attn.q_proj." + what, q_rows},
                    {p + "self_attn.k_proj." + what, kv_rows},
                    {p + "self_attn.v_proj." + what, kv_rows}};
        return {};
      };
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
  double block_fp8_saved_delta_per_token(const nn::ModelConfig& m, int, DType act,
                                         ActivationCheckpoint mode) const override {
    return decoder_fp8_saved_delta_per_token(nn::transformer_config(m), true, act, mode);
  }
  double block_backward_bytes_per_token(const nn::ModelConfig& m, int, DType act) const override {
    return swiglu_backward_bytes_per_token(static_cast<double>(nn::transformer_config(m).ffn_dim),
                                           act);
  }
  std::string selective_checkpoint_refusal() const override { return {}; }
  std::string generation_refusal() const override { return {}; }  // nn::CachedBlock blocks
  nlohmann::json shape_fields(const nn::ModelConfig& m) const override {
    return decoder_shape_fields(*this, m);
  }
  void read_shape_fields(const nlohmann::json& j, nn::ModelConfig& m) const override {
    ModelFamily::read_shape_fields(j, m);
    read_decoder_shape_fields(j, m);
  }
  checkpoint::HfNames hf_names(const nn::ModelConfig& m) const override {
    return decoder_hf_names(nn::transformer_config(m));
  }
  std::vector<std::string> hf_model_types() const override { return {"llama", "qwen2", "mistral"}; }
  void read_hf_config(const std::string& type, HfKeys& keys, nn::ModelConfig& m) const override {
    read_decoder_hf_config(type, keys, m);
  }
  nlohmann::json hf_config(const nn::ModelConfig& m, DType dtype) const override {
    return decoder_hf_config(m, dtype);
  }
};

const ModelFamily& llama_family() {
  static const LlamaFamily family;
  return family;
}

}  // namespace fsdp::models
