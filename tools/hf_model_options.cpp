// The transformer's Hugging Face dialects on the command line: the flags of the options that
// Llama 3, Qwen2 and Mistral models set (docs/transformer.md), and a model from a config.json
// (Note [Hugging Face configs] in src/models/hf_config.h).
#include "checkpoint/weight_files.h"
#include "fsdp/error.h"
#include "models/hf_config.h"
#include "tools/train_command.h"

namespace fsdp::tools {

void add_model_dialect_options(CLI::App& app, TrainOptions& o) {
  nn::ModelConfig& m = o.config.model;
  nn::RopeScaling& r = m.rope_scaling;
  auto model = [&](CLI::Option* opt) { o.model_opts.push_back(opt); };
  model(app.add_option("--head-dim", m.head_dim,
                       "transformer: the width of one attention head (0: dim / heads)"));
  model(app.add_option("--rope-theta", m.rope_theta, "transformer: RoPE's base"));
  model(app.add_option("--rope-scaling", r.type,
                       "transformer: RoPE frequency scaling: default (none) | llama3 (Llama "
                       "3.1's, with the four --rope-* values below)")
            ->check(CLI::IsMember({"default", "llama3"})));
  model(app.add_option("--rope-factor", r.factor, "llama3 rope scaling: factor"));
  model(app.add_option("--rope-low-freq-factor", r.low_freq_factor,
                       "llama3 rope scaling: low_freq_factor"));
  model(app.add_option("--rope-high-freq-factor", r.high_freq_factor,
                       "llama3 rope scaling: high_freq_factor"));
  model(app.add_option("--rope-original-max-positions", r.original_max_positions,
                       "llama3 rope scaling: original_max_position_embeddings"));
  model(app.add_option("--norm-eps", m.norm_eps, "transformer: the RMSNorms' epsilon"));
  model(
      app.add_flag("--tie-embeddings", m.tie_embeddings,
                   "transformer: the head uses the embedding's weight (one param) [default: off]"));
  model(app.add_flag("--attention-bias", m.attention_bias,
                     "transformer: biases on q, k and v, as Qwen2's [default: off]"));
  app.add_option("--hf-config", o.hf_config,
                 "a Hugging Face config.json (model_type llama, qwen2 or mistral) that sets the "
                 "model instead of the model flags [default: none; --init-from DIR's config.json]");
}

void apply_hf_model(const TrainOptions& o, TrainRun& run) {
  const std::string& init = o.config.checkpoint.init_from;
  const std::string in_dir = models::hf_config_in(init);
  FSDP_USER_CHECK(o.hf_config.empty() || in_dir.empty(), "--hf-config '", o.hf_config,
                  "' and --init-from '", init,
                  "' (whose config.json sets the model) both set "
                  "the model: give one of them");
  const std::string file = o.hf_config.empty() ? in_dir : o.hf_config;
  if (!file.empty()) {
    for (const CLI::Option* opt : o.model_opts)
      FSDP_USER_CHECK(opt->count() == 0, opt->get_name(), " cannot be given with ",
                      o.hf_config.empty() ? "--init-from" : "--hf-config", ": '", file,
                      "' sets the model");
    models::apply_hf_config(file, run.config.model);
    run.model_from_hf = true;
  }
  // The weights' files, opened and checked before any rank starts (Note [Weight directories]).
  if (!init.empty()) checkpoint::WeightFiles check(init);
}

}  // namespace fsdp::tools
