// The transformer's Hugging Face dialects on the command line: the flags of the options that
// Llama 3, Qwen2 and Mistral models set (docs/transformer.md).
#include "tools/train_command.h"

namespace fsdp::tools {

void add_model_dialect_options(CLI::App& app, TrainOptions& o) {
  nn::ModelConfig& m = o.config.model;
  nn::RopeScaling& r = m.rope_scaling;
  app.add_option("--head-dim", m.head_dim,
                 "transformer: the width of one attention head (0: dim / heads)");
  app.add_option("--rope-theta", m.rope_theta, "transformer: RoPE's base");
  app.add_option("--rope-scaling", r.type,
                 "transformer: RoPE frequency scaling: default (none) | llama3 (Llama 3.1's, "
                 "with the four --rope-* values below)")
      ->check(CLI::IsMember({"default", "llama3"}));
  app.add_option("--rope-factor", r.factor, "llama3 rope scaling: factor");
  app.add_option("--rope-low-freq-factor", r.low_freq_factor, "llama3 rope scaling: low_freq_factor");
  app.add_option("--rope-high-freq-factor", r.high_freq_factor,
                 "llama3 rope scaling: high_freq_factor");
  app.add_option("--rope-original-max-positions", r.original_max_positions,
                 "llama3 rope scaling: original_max_position_embeddings");
  app.add_option("--norm-eps", m.norm_eps, "transformer: the RMSNorms' epsilon");
  app.add_flag("--tie-embeddings", m.tie_embeddings,
               "transformer: the head uses the embedding's weight (one param) [default: off]");
  app.add_flag("--attention-bias", m.attention_bias,
               "transformer: biases on q, k and v, as Qwen2's [default: off]");
}

}  // namespace fsdp::tools
