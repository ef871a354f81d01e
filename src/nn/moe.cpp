// The MoE block. Its backward hands grads to FSDP in a chosen order (MoeGradOrder), so tests
// can fire the dense and expert param groups' post-backward in every order.
#include "fsdp/error.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/transformer.h"

namespace fsdp::nn {

MoeGradOrder parse_moe_grad_order(const std::string& name) {
  if (name == "dense-first") return MoeGradOrder::DenseFirst;
  if (name == "experts-first") return MoeGradOrder::ExpertsFirst;
  if (name == "interleaved") return MoeGradOrder::Interleaved;
  if (name == "experts-deferred") return MoeGradOrder::ExpertsDeferred;
  FSDP_FAIL("unknown MoE grad order '", name,
            "' (expected dense-first, experts-first, interleaved or experts-deferred)");
}

MoeBlock::MoeBlock(int64_t dim, int64_t hidden, int experts, MoeGradOrder order, uint64_t seed,
                   bool norm)
    : Module("MoeBlock"), experts_(experts), order_(order) {
  FSDP_CHECK(experts >= 1, "an MoE block needs at least one expert, got ", experts);
  if (norm) norm_ = &add_child("norm", std::make_unique<RMSNorm>(dim, kNormEps));
  router_ = &add_child("router", std::make_unique<Linear>(dim, experts, false, seed * 7 + 1));
  auto group = std::make_unique<Sequential>();
  for (int e = 0; e < experts; ++e) {
    auto expert = std::make_unique<Sequential>();
    auto& fc1 = expert->append(std::make_unique<Linear>(dim, hidden, false, seed * 7 + 2 + 2 * e));
    expert->append(std::make_unique<Act>(Activation::GELU));
    auto& fc2 = expert->append(std::make_unique<Linear>(hidden, dim, false, seed * 7 + 3 + 2 * e));
    fc1.defer_weight_grad = fc2.defer_weight_grad = order == MoeGradOrder::ExpertsDeferred;
    expert_.push_back(&group->append(std::move(expert)));
  }
  add_child("experts", std::move(group));
}

bool MoeBlock::is_expert_param(const Module& owner) {
  const std::string& f = owner.fqn();
  return f.find("experts.") != std::string::npos;
}

void MoeBlock::drop_own_saved(ActivationCheckpoint what) {
  if (what != ActivationCheckpoint::Full) return;
  probs_ = Tensor{};
  expert_out_.clear();
}

Tensor MoeBlock::forward_impl(RunContext& ctx, const Tensor& x_in) {
  Device& d = *ctx.device;
  const Tensor& x_res = x_in;
  const Tensor x = norm_ ? norm_->forward(ctx, x_in) : x_in;  // the branch's input
  Tensor logits = router_->forward(ctx, x);
  probs_ = empty_tensor(d, ctx.compute, DType::F32, x.rows, experts_, MemTag::Activation);
  d.set_label(op_label("fwd", "router softmax"));
  d.softmax_rows(ctx.compute, logits.data, logits.dtype, probs_.as<float>(), x.rows, experts_);
  Tensor y = empty_tensor(d, ctx.compute, ctx.act_dtype, x.rows, x.cols, MemTag::Activation);
  d.copy(ctx.compute, y.data, x_res.data, x_res.bytes());  // the residual
  expert_out_.clear();
  for (int e = 0; e < experts_; ++e) {
    Tensor out = expert_[e]->forward(ctx, x);
    d.set_label(op_label("fwd", "combine"));
    d.scale_rows(ctx.compute, y.data, out.data, out.dtype, probs_.as<float>() + e, experts_,
                 x.rows, x.cols, true);
    expert_out_.push_back(std::move(out));
  }
  return y;
}

Tensor MoeBlock::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  Device& d = *ctx.device;
  const int64_t rows = dy.rows, cols = dy.cols;
  // The branch's input grad: with a norm it starts at zero and goes through the norm at the
  // end; without, the branch adds straight onto the residual's dy.
  Tensor dx = empty_tensor(d, ctx.compute, ctx.act_dtype, rows, cols, MemTag::Activation);
  if (norm_)
    d.fill(ctx.compute, dx.data, dx.dtype, dx.numel(), 0.0f);
  else
    d.copy(ctx.compute, dx.data, dy.data, dy.bytes());  // the residual
  // d(loss)/d(prob_e) = <dy, expert_e(x)> per token; needs no expert backward.
  Tensor dprobs = empty_tensor(d, ctx.compute, DType::F32, rows, experts_, MemTag::Activation);
  d.set_label(op_label("bwd", "combine"));
  for (int e = 0; e < experts_; ++e)
    d.row_dot(ctx.compute, dy.data, expert_out_[e].data, dy.dtype, dprobs.as<float>() + e,
              experts_, rows, cols);
  expert_out_.clear();

  auto expert_backward = [&](int e) {
    Tensor dh = empty_tensor(d, ctx.compute, ctx.act_dtype, rows, cols, MemTag::Activation);
    d.set_label(op_label("bwd", "combine"));
    d.scale_rows(ctx.compute, dh.data, dy.data, dy.dtype, probs_.as<float>() + e, experts_, rows,
                 cols, false);
    Tensor dxe = expert_[e]->backward(ctx, dh);
    d.add(ctx.compute, dx.data, dx.data, dxe.data, dx.dtype, dx.numel());
  };
  auto router_backward = [&] {
    Tensor dlogits = empty_tensor(d, ctx.compute, ctx.act_dtype, rows, experts_, MemTag::Activation);
    d.set_label(op_label("bwd", "router softmax"));
    d.softmax_rows_backward(ctx.compute, probs_.as<float>(), dprobs.as<float>(), dlogits.data,
                            dlogits.dtype, rows, experts_);
    Tensor dxr = router_->backward(ctx, dlogits);
    d.add(ctx.compute, dx.data, dx.data, dxr.data, dx.dtype, dx.numel());
  };

  switch (order_) {
    case MoeGradOrder::DenseFirst:
      router_backward();
      for (int e = 0; e < experts_; ++e) expert_backward(e);
      break;
    case MoeGradOrder::ExpertsFirst:
    case MoeGradOrder::ExpertsDeferred:  // weight grads come later, from the root
      for (int e = 0; e < experts_; ++e) expert_backward(e);
      router_backward();
      break;
    case MoeGradOrder::Interleaved:
      for (int e = 0; e < experts_ / 2; ++e) expert_backward(e);
      router_backward();
      for (int e = experts_ / 2; e < experts_; ++e) expert_backward(e);
      break;
  }
  probs_ = Tensor{};
  if (!norm_) return dx;
  Tensor dnorm = norm_->backward(ctx, dx);
  Tensor out = empty_tensor(d, ctx.compute, ctx.act_dtype, rows, cols, MemTag::Activation);
  d.set_label(op_label("bwd", "residual"));
  d.add(ctx.compute, out.data, dy.data, dnorm.data, out.dtype, out.numel());
  return out;
}

}  // namespace fsdp::nn
