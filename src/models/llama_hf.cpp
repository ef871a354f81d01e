// The transformer family's Hugging Face config.json (Note [Hugging Face configs]): the keys of
// transformers' LlamaConfig, Qwen2Config and MistralConfig, read into the transformer's
// options. Qwen2 always has q/k/v biases and Mistral never does (their classes fix them);
// Llama's attention_bias would bias o_proj too, so it must be false.
#include <algorithm>
#include <limits>

#include "fsdp/nn/transformer.h"
#include "models/hf_config.h"
#include "models/llama_parts.h"

namespace fsdp::models {

namespace {

constexpr double kHugeTheta = 1e12;

// The llama3 (or default) scaling keys of rope_scaling or rope_parameters, and done().
void read_rope_scaling(HfKeys& k, nn::RopeScaling& r) {
  // "type" is the older name of "rope_type".
  const nlohmann::json* type = k.get("rope_type");
  if (type == nullptr || type->is_null())
    type = k.get("type");
  else
    k.ignore("type");
  if (type != nullptr && !type->is_null() && !type->is_string())
    k.fail_key("rope_type", "is ", type->dump(), ", not a string");
  r.type = type == nullptr || type->is_null() ? "default" : type->get<std::string>();
  if (r.type == "llama3") {
    r.factor = k.number("factor", 1, 1e6);
    r.low_freq_factor = k.number("low_freq_factor", 1e-6, 1e6);
    r.high_freq_factor = k.number("high_freq_factor", 1e-6, 1e6);
    if (r.high_freq_factor <= r.low_freq_factor)
      k.fail_key("high_freq_factor", "is ", r.high_freq_factor, ", not above low_freq_factor ",
                 r.low_freq_factor);
    r.original_max_positions = k.integer("original_max_position_embeddings", 1, int64_t{1} << 40);
  } else if (r.type != "default") {
    k.fail_key("rope_type", "is \"", r.type,
               "\"; only \"default\" and \"llama3\" rope scaling are implemented");
  }
  k.done("the rotary embedding");
}

// rope_theta and rope_scaling (transformers 4), or rope_parameters (transformers 5).
void read_rope(HfKeys& k, nn::ModelConfig& m) {
  const nlohmann::json* params = k.get("rope_parameters");
  const nlohmann::json* scaling = k.get("rope_scaling");
  const bool has_theta = k.get("rope_theta") && !k.get("rope_theta")->is_null();
  const double theta = k.number("rope_theta", 1.0001, kHugeTheta, 10000.0);
  m.rope_theta = theta;
  m.rope_scaling = {};
  if (params != nullptr && !params->is_null()) {
    HfKeys p(*params, "rope_parameters", k.file());
    m.rope_theta = p.number("rope_theta", 1.0001, kHugeTheta, theta);
    if (has_theta && m.rope_theta != theta)
      k.fail_key("rope_theta", "is ", theta, ", rope_parameters.rope_theta ", m.rope_theta);
    read_rope_scaling(p, m.rope_scaling);
    if (scaling != nullptr && !scaling->is_null() && *scaling != *params)
      k.fail_key("rope_scaling", "and rope_parameters are both given, and differ");
    return;
  }
  if (scaling != nullptr && !scaling->is_null()) {
    HfKeys s(*scaling, "rope_scaling", k.file());
    read_rope_scaling(s, m.rope_scaling);
  }
}

// sliding_window: where it applies, a window shorter than seq_len is refused when the model
// is resolved (the attention has no window).
void read_sliding_window(const std::string& type, HfKeys& k, nn::ModelConfig& m) {
  if (type == "llama") return;  // none: the key is refused as unknown
  int64_t window = k.integer("sliding_window", 1, std::numeric_limits<int64_t>::max(), 0);
  if (type == "qwen2") {
    // Qwen2 windows only with use_sliding_window, and only layers from max_window_layers on.
    const bool use = k.boolean("use_sliding_window", false);
    const int64_t from = k.integer("max_window_layers", 0, int64_t{1} << 40, 0);
    if (!use || from >= m.layers) window = 0;
  }
  if (const nlohmann::json* types = k.get("layer_types"); types && !types->is_null()) {
    if (!types->is_array() || static_cast<int64_t>(types->size()) != m.layers)
      k.fail_key("layer_types", "is not a list of ", m.layers, " layer types");
    bool sliding = false;
    for (const nlohmann::json& t : *types) {
      if (t != "full_attention" && t != "sliding_attention")
        k.fail_key("layer_types", "holds ", t.dump(),
                   "; only \"full_attention\" and \"sliding_attention\" are known");
      sliding = sliding || t == "sliding_attention";
    }
    if (!sliding) window = 0;
    if (sliding && window == 0)
      k.fail_key("layer_types", "has sliding_attention layers but sliding_window is not set");
  }
  m.sliding_window = window;
}

}  // namespace

void read_decoder_hf_config(const std::string& type, HfKeys& k, nn::ModelConfig& m) {
  m.kind = "transformer";
  m.dim = k.integer("hidden_size", 1, int64_t{1} << 20);
  m.ffn_dim = k.integer("intermediate_size", 1, int64_t{1} << 22);
  m.layers = static_cast<int>(k.integer("num_hidden_layers", 1, 100000));
  m.heads = k.integer("num_attention_heads", 1, int64_t{1} << 16);
  m.kv_heads = k.integer("num_key_value_heads", 1, m.heads, m.heads);
  const int64_t head_dim = k.integer("head_dim", 1, int64_t{1} << 16, 0);
  // The plain dim / heads is left implicit, so the model's shape fields stay those it had.
  m.head_dim = head_dim > 0 && m.dim % m.heads == 0 && head_dim == m.dim / m.heads ? 0 : head_dim;
  m.vocab = k.integer("vocab_size", 1, std::numeric_limits<int32_t>::max());
  m.norm_eps = k.number("rms_norm_eps", 1e-30, 1.0, 1e-6);  // the classes' default
  m.tie_embeddings = k.boolean("tie_word_embeddings", false);
  // Qwen2's biases are on q, k and v; Llama's attention_bias puts one on o_proj too, which
  // this model does not have.
  m.attention_bias = type == "qwen2";
  k.require("attention_bias", m.attention_bias,
            type == "qwen2"   ? "Qwen2's q, k and v always have biases"
            : type == "llama" ? "Llama's attention_bias also puts a bias on o_proj, which this "
                                "model does not have; Qwen2's q/k/v biases are model_type qwen2"
                              : "Mistral's projections have no biases");
  if (type == "llama") k.ignore("pretraining_tp");  // split matmuls of the same math
  k.require("hidden_act", "silu", "the feed-forward is SwiGLU, with silu");
  k.require("mlp_bias", false, "the feed-forward has no biases");
  k.require("attention_dropout", 0.0, "dropout changes what a step computes");
  read_rope(k, m);
  read_sliding_window(type, k, m);
}

nlohmann::json decoder_hf_config(const nn::ModelConfig& m, DType dtype) {
  const nn::TransformerConfig c = nn::transformer_config(m);
  // The class whose math this model is: Qwen2's q/k/v biases, Mistral's window, else Llama.
  const std::string type = c.attention_bias ? "qwen2" : m.sliding_window > 0 ? "mistral" : "llama";
  const std::string arch = type == "qwen2"     ? "Qwen2ForCausalLM"
                           : type == "mistral" ? "MistralForCausalLM"
                                               : "LlamaForCausalLM";
  const nn::RopeScaling& r = c.rope_scaling;
  int64_t positions = c.seq_len;
  if (r.type == "llama3")
    positions = std::max(
        positions, static_cast<int64_t>(static_cast<double>(r.original_max_positions) * r.factor));
  nlohmann::json j = {{"architectures", {arch}},
                      {"model_type", type},
                      {"hidden_size", c.dim},
                      {"intermediate_size", c.ffn_dim},
                      {"num_hidden_layers", c.layers},
                      {"num_attention_heads", c.heads},
                      {"num_key_value_heads", c.kv_heads},
                      {"head_dim", c.head_dim()},
                      {"vocab_size", c.vocab},
                      {"hidden_act", "silu"},
                      {"rms_norm_eps", m.norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"rope_scaling", nullptr},
                      {"tie_word_embeddings", c.tie_embeddings},
                      {"attention_dropout", 0.0},
                      {"max_position_embeddings", positions},
                      {"initializer_range", nn::kTransformerInitStd},
                      {"use_cache", true},
                      {"torch_dtype", dtype == DType::BF16 ? "bfloat16" : "float32"}};
  if (r.type == "llama3")
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_positions}};
  if (type == "llama") {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  } else if (type == "qwen2") {
    j["use_sliding_window"] = m.sliding_window > 0;
    j["sliding_window"] = m.sliding_window > 0 ? nlohmann::json(m.sliding_window) : nullptr;
    j["max_window_layers"] = 0;  // every layer, as this model's window
  } else {
    j["sliding_window"] = m.sliding_window;
  }
  return j;
}

}  // namespace fsdp::models
