#include "fsdp/nn/model.h"

#include <algorithm>
#include <cmath>

#include "fsdp/error.h"
#include "fsdp/synthetic.h"

namespace fsdp::nn {

Model::Model(const ModelConfig& c) : Module("Model"), config_(c) {
  FSDP_CHECK(c.layers >= 1, "--layers must be >= 1, got ", c.layers);
  FSDP_CHECK(c.dim >= 1, "--dim must be >= 1, got ", c.dim);
  FSDP_CHECK(c.kind == "mlp" || c.kind == "resmlp" || c.kind == "moe" || c.kind == "spin" ||
                 c.kind == "transformer" || c.kind == "moe-transformer",
             "unknown model '", c.kind,
             "' (expected mlp, resmlp, moe, spin, transformer or moe-transformer)");
  if (c.kind == "transformer") {
    build_transformer();
    return;
  }
  if (c.kind == "moe-transformer") {
    build_moe_transformer();
    return;
  }
  for (int i = 0; i < c.layers; ++i) {
    const uint64_t seed = c.seed * 1000003ull + static_cast<uint64_t>(i) * 7919ull;
    std::unique_ptr<Module> block;
    if (c.kind == "mlp") {  // Linear(D, D, bias=False) + ReLU, the ReLU fused into the GEMM
      // He init (variance 2 / D): a ReLU halves the second moment, so the signal keeps its
      // scale at any depth (with 1 / sqrt(D) it shrank 6x a layer and underflowed by 64).
      const float bound = std::sqrt(6.0f / static_cast<float>(c.dim));
      auto linear = std::make_unique<Linear>(c.dim, c.dim, uniform_init(seed, c.dim * c.dim, bound));
      linear->fused_relu = true;
      block = std::move(linear);
    } else if (c.kind == "spin") {
      block = std::make_unique<SpinBlock>(c.dim, c.spin_forward_us, c.spin_backward_us);
    } else if (c.kind == "resmlp") {
      block = std::make_unique<ResidualMlp>(c.dim, c.hidden ? c.hidden : 4 * c.dim,
                                            Activation::GELU, seed, c.norm);
    } else {
      block = std::make_unique<MoeBlock>(c.dim, c.hidden ? c.hidden : c.dim, c.experts,
                                         c.grad_order, seed, c.norm);
    }
    blocks_.push_back(&add_child("layers." + std::to_string(i), std::move(block)));
  }
  if (c.classes > 0)
    head_ = &add_child("head", std::make_unique<Linear>(c.dim, c.classes, true, c.seed * 31 + 5));
}

int64_t Model::param_count() {
  int64_t n = 0;
  for (Param* p : all_params()) n += p->numel();
  return n;
}

Tensor Model::forward_impl(RunContext& ctx, const Tensor& x) {
  Tensor h = x;
  if (embedding_) h = embedding_->forward(ctx, h);
  for (Module* b : blocks_) h = b->forward(ctx, h);
  if (final_norm_) h = final_norm_->forward(ctx, h);
  if (head_) h = head_->forward(ctx, h);
  return h;
}

Tensor Model::backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) {
  Tensor g = dy;
  if (head_) g = head_->backward(ctx, g);
  if (final_norm_) g = final_norm_->backward(ctx, g);
  // The first block computes d(loss)/d(input) only if the caller (or the embedding) wants it.
  const bool first_input_grad = input_grad || embedding_ != nullptr;
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
    g = (*it)->backward(ctx, g, first_input_grad || std::next(it) != blocks_.rend());
  if (embedding_) g = embedding_->backward(ctx, g, false);  // token ids: no gradient
  // Weight grads that blocks deferred (MoeGradOrder::ExpertsDeferred) are computed last.
  visit([&](Module& m) {
    if (auto* lin = dynamic_cast<Linear*>(&m)) lin->flush_deferred_grads(ctx);
  });
  release_deferred_expert_grads(ctx);
  return g;
}

std::vector<int64_t> unit_param_counts(const ModelConfig& c) {
  std::vector<int64_t> units;
  const int64_t d = c.dim;
  int64_t root = c.classes > 0 ? c.classes * d + c.classes : 0;
  int64_t block = 0;
  if (c.kind == "transformer") {
    const TransformerConfig t = transformer_config(c);
    block = d * (t.heads + 2 * t.kv_heads) * t.head_dim() + t.heads * t.head_dim() * d +
            3 * d * t.ffn_dim + 2 * d;
    root = 2 * t.vocab * d + d;
  } else if (c.kind == "resmlp") {
    const int64_t h = c.hidden ? c.hidden : 4 * d;
    block = 2 * d * h + h + d + (c.norm ? d : 0);
  } else if (c.kind == "moe") {
    const int64_t h = c.hidden ? c.hidden : d;
    block = c.experts * d + c.experts * 2 * d * h + (c.norm ? d : 0);
  } else {  // mlp, spin
    block = d * d;
  }
  units.assign(static_cast<size_t>(c.layers), block);
  units.push_back(root);
  return units;
}

double flops_per_token(const ModelConfig& c) {
  if (c.kind == "transformer") return transformer_flops_per_token(transformer_config(c));
  if (c.kind == "moe-transformer") {
    // Active params (docs/moe.md): an MoE block counts its router and K of its experts; the
    // attention term as the dense transformer's.
    const TransformerConfig t = transformer_config(c);
    const MoeConfig m = moe_config(c);
    const double d = static_cast<double>(t.dim);
    const double attention = d * static_cast<double>((t.heads + 2 * t.kv_heads) * t.head_dim()) +
                             static_cast<double>(t.heads * t.head_dim()) * d + 2 * d;
    double gemm_params = static_cast<double>(t.vocab) * d + d;  // the head and the final norm
    for (int i = 0; i < t.layers; ++i)
      gemm_params += attention + (is_moe_layer(i, c.moe_every)
                                      ? m.experts * d + m.top_k * 3 * d * static_cast<double>(m.expert_ffn_dim)
                                      : 3 * d * static_cast<double>(t.ffn_dim));
    return 6.0 * gemm_params + 12.0 * t.layers * static_cast<double>(t.heads * t.head_dim()) * t.seq_len;
  }
  double params = 0;
  for (int64_t n : unit_param_counts(c)) params += static_cast<double>(n);
  return 6.0 * params;
}

}  // namespace fsdp::nn
