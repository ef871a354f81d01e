// The MoE transformer as the engine's root Model (kind "moe-transformer", docs/moe.md): the
// transformer's tree with an MoeFeedForward ("layers.{i}.moe") in every other block.
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
  FSDP_USER_CHECK(m.moe_every >= 1, "--moe-every must be >= 1, got ", m.moe_every);
  return c;
}

void Model::build_moe_transformer() {
  const TransformerConfig c = transformer_config(config_);
  const MoeConfig m = moe_config(config_);
  embedding_ = &add_child(
      "tok_embeddings",
      std::make_unique<Embedding>(c.vocab, c.dim,
                                  transformer_param_seed(c.seed, -1, InitRole::Embedding)));
  int moe_index = 0;
  for (int i = 0; i < c.layers; ++i) {
    const std::string name = "layers." + std::to_string(i);
    if (!is_moe_layer(i, config_.moe_every)) {
      blocks_.push_back(&add_child(name, std::make_unique<TransformerBlock>(c, i)));
      continue;
    }
    auto block = std::make_unique<MoeTransformerBlock>(c, m, i);
    // Which of the block's two param groups gets all its grads first (tests use every order).
    const MoeGradOrder order = config_.expert_grad_order;
    const bool dense_first = order == MoeGradOrder::DenseFirst ||
                             (order == MoeGradOrder::Interleaved && moe_index % 2 == 1);
    block->moe().experts().hold_grads = dense_first || order == MoeGradOrder::ExpertsDeferred;
    block->defer_expert_grads_to_root = order == MoeGradOrder::ExpertsDeferred;
    ++moe_index;
    blocks_.push_back(&add_child(name, std::move(block)));
  }
  final_norm_ = &add_child("norm", std::make_unique<RMSNorm>(c.dim, c.norm_eps));
  head_ = &add_child(
      "output", std::make_unique<Linear>(
                    c.dim, c.vocab,
                    normal_init(transformer_param_seed(c.seed, -1, InitRole::Output),
                                c.vocab * c.dim, kTransformerInitStd)));
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
