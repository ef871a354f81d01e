#include "models/initial_weights.h"

#include "checkpoint/full_weights.h"
#include "checkpoint/sharded_state.h"
#include "models/model_family.h"

namespace fsdp::models {

namespace {

// Every param's initial values (every expert's: their init depends on the global index only,
// docs/moe.md), of a model built here.
std::unique_ptr<nn::Model> initial_model(const nn::ModelConfig& config,
                                         std::vector<checkpoint::FullTensor>& tensors) {
  nn::ModelConfig all_experts = config;
  all_experts.ep = 1;
  all_experts.ep_rank = 0;
  std::unique_ptr<nn::Model> model = build_model(all_experts);
  model->visit([&](Module& m) {
    for (const auto& p : m.params())
      tensors.push_back({checkpoint::param_fqn(m, *p), p->shape(), p->init_values().data()});
  });
  return model;
}

}  // namespace

void export_initial_weights(const nn::ModelConfig& config, const std::string& out_path,
                            DType dtype) {
  std::vector<checkpoint::FullTensor> tensors;
  const auto model = initial_model(config, tensors);
  checkpoint::write_full_weights(out_path, tensors, dtype,
                                 family(config.kind).hf_names(model->config()));
}

void export_initial_weights_hf(const nn::ModelConfig& config, const std::string& out_dir,
                               DType dtype, uint64_t max_shard_bytes) {
  std::vector<checkpoint::FullTensor> tensors;
  const auto model = initial_model(config, tensors);
  const ModelFamily& f = family(config.kind);
  const nlohmann::json hf = f.hf_config(model->config(), dtype);
  FSDP_USER_CHECK(hf.is_object(), "model '", config.kind,
                  "' has no Hugging Face config: export it as one file instead");
  checkpoint::write_hf_directory(out_dir, tensors, dtype, f.hf_names(model->config()), hf,
                                 max_shard_bytes);
}

}  // namespace fsdp::models
