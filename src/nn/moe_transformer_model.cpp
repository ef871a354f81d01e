// The MoE layer's settings from a ModelConfig, and what the root Model does for the MoE layers
// it holds (docs/moe.md). The MoE transformer's tree is built by its model family
// (src/models/moe_llama.cpp).
#include <algorithm>

#include "fsdp/error.h"
#include "fsdp/nn/model.h"

namespace fsdp::nn {

MoeConfig moe_config(const ModelConfig& m) {
  MoeConfig c;
  c.experts = m.experts;
  c.top_k = m.top_k;
  c.expert_ffn_dim = m.expert_ffn_dim > 0 ? m.expert_ffn_dim : transformer_config(m).ffn_dim;
  c.capacity_factor = m.capacity_factor;
  c.aux_loss_weight = m.aux_loss_weight;
  c.ep = m.ep;
  c.ep_rank = m.ep_rank;
  c.group_tokens = m.moe_group_tokens;
  c.validate();
  FSDP_OPTION_CHECK(m.moe_every >= 1, OptionName{"moe_every"}, " must be >= 1, got ", m.moe_every);
  return c;
}

int64_t Model::active_param_count() {
  int64_t n = 0;
  visit([&](Module& m) {
    const bool experts = dynamic_cast<GroupedExperts*>(&m) != nullptr;
    for (const auto& p : m.params())
      n += experts ? p->numel() / p->rows() * config_.top_k : p->numel();  // rows: local experts
  });
  return n;
}

void Model::set_expert_comm(Comm* ep) {
  visit([&](Module& m) {
    if (auto* moe = dynamic_cast<MoeFeedForward*>(&m)) moe->set_expert_comm(ep);
  });
}

int Model::moe_layer_count() {
  int n = 0;
  visit([&](Module& m) { n += dynamic_cast<MoeFeedForward*>(&m) != nullptr; });
  return n;
}

void Model::add_aux_loss(Device& d, Stream s, float* loss) {
  std::vector<const float*> stats;
  visit([&](Module& m) {
    if (auto* moe = dynamic_cast<MoeFeedForward*>(&m); moe && moe->stats()) stats.push_back(moe->stats());
  });
  if (stats.empty()) return;
  float* sum = static_cast<float*>(d.alloc(sizeof(float), s, MemTag::Other));
  d.fill(s, sum, DType::F32, 1, 0.0f);
  for (const float* layer : stats) d.accumulate(s, sum, layer, DType::F32, 1, 1.0f);
  d.accumulate(s, loss, sum, DType::F32, 1, 1.0f);
  d.free(sum, s);
}

// No label of its own: the copies belong to the step's end, as the step reader's do.
void Model::copy_expert_loads(Device& d, Stream s, float* dst) {
  int i = 0;
  visit([&](Module& m) {
    auto* moe = dynamic_cast<MoeFeedForward*>(&m);
    if (!moe) return;
    if (moe->stats())
      d.copy(s, dst + i, moe->stats() + 1, sizeof(float));
    else
      d.fill(s, dst + i, DType::F32, 1, -1.0f);
    ++i;
  });
}

void Model::release_deferred_expert_grads(RunContext& ctx) {
  for (Module* b : blocks_)
    if (auto* block = dynamic_cast<MoeTransformerBlock*>(b))
      if (block->defer_expert_grads_to_root) block->moe().experts().release_held_grads(ctx);
}

}  // namespace fsdp::nn
