#include "models/initial_weights.h"

#include "checkpoint/full_weights.h"
#include "checkpoint/sharded_state.h"
#include "models/model_family.h"

namespace fsdp::models {

void export_initial_weights(const nn::ModelConfig& config, const std::string& out_path,
                            DType dtype) {
  nn::ModelConfig all_experts = config;
  all_experts.ep = 1;  // every expert: their init depends on the global index only (docs/moe.md)
  all_experts.ep_rank = 0;
  std::unique_ptr<nn::Model> model = build_model(all_experts);
  std::vector<checkpoint::FullTensor> tensors;
  model->visit([&](Module& m) {
    for (const auto& p : m.params())
      tensors.push_back({checkpoint::param_fqn(m, *p), p->shape(), p->init_values().data()});
  });
  checkpoint::write_full_weights(out_path, tensors, dtype,
                                 family(config.kind).hf_names(all_experts));
}

}  // namespace fsdp::models
