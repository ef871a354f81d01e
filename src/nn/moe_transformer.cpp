// The MoE transformer's modules: the grouped experts, the MoE feed-forward (router, dispatch,
// combine) and the block that holds it. Routing and dispatch are in moe_transformer_routing.cpp.
#include <algorithm>

#include "fsdp/error.h"
#include "fsdp/nn/moe.h"
#include "fsdp/synthetic.h"
#include "fsdp/nn/layers.h"
#include "nn/moe_transformer_rows.h"

namespace fsdp::nn {

namespace {

Tensor new_act(RunContext& ctx, int64_t rows, int64_t cols) {
  return empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, rows, cols, MemTag::Activation);
}

void* at(void* base, int64_t elements, DType t) {
  return static_cast<char*>(base) + static_cast<size_t>(elements) * dtype_size(t);
}

// A role past InitRole's: the experts' streams (one per global expert) from the model's seed.
constexpr int kExpertRoleBase = 8;

// x with one more row of zeros (what the padding slots of static shapes read).
Tensor with_zero_row(RunContext& ctx, const Tensor& x) {
  Tensor out = empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, x.rows + 1, x.cols,
                            MemTag::Activation);
  ctx.device->copy(ctx.compute, out.data, x.data, x.bytes());
  ctx.device->fill(ctx.compute, at(out.data, x.numel(), ctx.act_dtype), ctx.act_dtype, x.cols, 0.0f);
  return out;
}

}  // namespace

uint64_t expert_param_seed(uint64_t seed, int layer, int expert) {
  return splitmix64_at(transformer_param_seed(seed, layer, static_cast<InitRole>(kExpertRoleBase)),
                       static_cast<uint64_t>(expert));
}

// ---- GroupedExperts

GroupedExperts::GroupedExperts(const TransformerConfig& c, const MoeConfig& m, int layer)
    : Module("GroupedExperts"), dim_(c.dim), ffn_(m.expert_ffn_dim), local_(m.local_experts()) {
  // Each local expert's rows, one after another, from its global expert's own stream.
  const float w2_std = residual_projection_init_std(layer);
  const uint64_t model_seed = c.seed;
  const int first = m.ep_rank * local_, local = local_;
  auto experts_init = [=](int64_t rows, int64_t cols, uint64_t offset, float std) {
    return [=] {
      std::vector<float> out;
      out.reserve(static_cast<size_t>(local * rows * cols));
      for (int l = 0; l < local; ++l) {
        const uint64_t seed = expert_param_seed(model_seed, layer, first + l);
        const std::vector<float> v = normal_init(seed * 2 + offset, rows * cols, std);
        out.insert(out.end(), v.begin(), v.end());
      }
      return out;
    };
  };
  add_param("w13", {local_, 2 * ffn_, dim_}, experts_init(2 * ffn_, dim_, 1, kTransformerInitStd));
  add_param("w2", {local_, dim_, ffn_}, experts_init(dim_, ffn_, 2, w2_std));
}

// out_l = w2_l(silu(x_l w1_l^T) * (x_l w3_l^T)) for each local expert l's rows x_l.
Tensor GroupedExperts::forward_impl(RunContext& ctx, const Tensor& x) {
  Device& d = *ctx.device;
  const DType t = ctx.act_dtype;
  FSDP_CHECK(static_cast<int>(counts.size()) == local_, "GroupedExperts ", fqn(), ": ",
             counts.size(), " counts for ", local_, " local experts");
  if (fp8()) return forward_fp8(ctx, x);  // Note [Fp8 experts]
  const int64_t rows = x.rows;
  Tensor h = new_act(ctx, rows, 2 * ffn_), act = new_act(ctx, rows, ffn_), out = new_act(ctx, rows, dim_);
  void* w13 = params()[0]->value.data;
  void* w2 = params()[1]->value.data;
  // Note [Grouped GEMM]: every local expert in one call per projection.
  std::vector<Device::GemmGroup> g(static_cast<size_t>(local_));
  int64_t off = 0;
  for (int l = 0; l < local_; ++l) {
    const int64_t n = counts[l];
    g[l] = {n, 2 * ffn_, dim_, at(x.data, off * dim_, t), at(w13, l * 2 * ffn_ * dim_, t),
            at(h.data, off * 2 * ffn_, t)};
    off += n;
  }
  FSDP_CHECK(off == rows, "GroupedExperts ", fqn(), ": counts sum to ", off, ", input has ", rows, " rows");
  d.set_label(op_label("fwd", "expert gemm"));
  if (rows > 0) d.grouped_gemm(ctx.compute, false, true, g.data(), local_, t, t);
  if (rows > 0) {
    d.set_label(op_label("fwd", "expert swiglu"));
    d.swiglu_forward(ctx.compute, h.data, t, rows, ffn_, act.data, nullptr);
  }
  off = 0;
  for (int l = 0; l < local_; ++l) {
    const int64_t n = counts[l];
    g[l] = {n, dim_, ffn_, at(act.data, off * ffn_, t), at(w2, l * dim_ * ffn_, t),
            at(out.data, off * dim_, t)};
    off += n;
  }
  d.set_label(op_label("fwd", "expert gemm"));
  if (rows > 0) d.grouped_gemm(ctx.compute, false, true, g.data(), local_, t, t);
  saved_x_ = x;
  saved_h_ = std::move(h);
  saved_act_ = std::move(act);
  saved_counts_ = counts;
  return out;
}

Tensor GroupedExperts::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  Device& d = *ctx.device;
  const DType t = ctx.act_dtype;
  const int64_t rows = saved_x_.rows;
  Param& p13 = *params()[0];
  Param& p2 = *params()[1];
  Tensor dw13 = empty_tensor(d, ctx.compute, t, p13.rows(), p13.cols(), MemTag::Grad);
  Tensor dw2 = empty_tensor(d, ctx.compute, t, p2.rows(), p2.cols(), MemTag::Grad);
  if (rows > 0 && !saved_act_.defined()) {  // Note [Activation checkpointing]: selective
    saved_act_ = new_act(ctx, rows, ffn_);
    d.set_label(op_label("recompute", "expert swiglu"));
    d.swiglu_forward(ctx.compute, saved_h_.data, t, rows, ffn_, saved_act_.data, nullptr);
  }
  Tensor dx, dact, dh;  // held to the end, as the memory estimate assumes
  if (fp8()) {
    dx = backward_fp8(ctx, dy, dw13, dw2);  // Note [Fp8 experts]
  } else {
    dact = new_act(ctx, rows, ffn_);
    dh = new_act(ctx, rows, 2 * ffn_);
    dx = new_act(ctx, rows, dim_);
    // Weight grads: one group per local expert, k = its rows (0 rows: a zero grad, which FSDP
    // reduces like any other). Input grads: m = its rows.
    std::vector<Device::GemmGroup> dw(static_cast<size_t>(local_)), dx_groups(static_cast<size_t>(local_));
    int64_t off = 0;
    for (int l = 0; l < local_; ++l) {
      const int64_t n = saved_counts_[l];
      const void* dout = at(dy.data, off * dim_, t);
      dw[l] = {dim_, ffn_, n, dout, at(saved_act_.data, off * ffn_, t), at(dw2.data, l * dim_ * ffn_, t)};
      dx_groups[l] = {n, ffn_, dim_, dout, at(p2.value.data, l * dim_ * ffn_, t), at(dact.data, off * ffn_, t)};
      off += n;
    }
    d.set_label(op_label("bwd", "expert gemm"));
    d.grouped_gemm(ctx.compute, true, false, dw.data(), local_, t, t);
    if (rows > 0) d.grouped_gemm(ctx.compute, false, false, dx_groups.data(), local_, t, t);
    if (rows > 0) {
      d.set_label(op_label("bwd", "expert swiglu"));
      d.swiglu_backward(ctx.compute, saved_h_.data, dact.data, t, rows, ffn_, dh.data, nullptr);
    }
    off = 0;
    for (int l = 0; l < local_; ++l) {
      const int64_t n = saved_counts_[l];
      const void* dhl = at(dh.data, off * 2 * ffn_, t);
      dw[l] = {2 * ffn_, dim_, n, dhl, at(saved_x_.data, off * dim_, t), at(dw13.data, l * 2 * ffn_ * dim_, t)};
      dx_groups[l] = {n, dim_, 2 * ffn_, dhl, at(p13.value.data, l * 2 * ffn_ * dim_, t), at(dx.data, off * dim_, t)};
      off += n;
    }
    d.set_label(op_label("bwd", "expert gemm"));
    d.grouped_gemm(ctx.compute, true, false, dw.data(), local_, t, t);
    if (rows > 0) d.grouped_gemm(ctx.compute, false, false, dx_groups.data(), local_, t, t);
  }
  saved_x_ = saved_h_ = saved_act_ = Tensor{};
  saved_padded_.clear();
  if (hold_grads) {
    held_.push_back(std::move(dw2));
    held_.push_back(std::move(dw13));
  } else {
    p2.set_grad(ctx, std::move(dw2));
    p13.set_grad(ctx, std::move(dw13));
  }
  return dx;
}

void GroupedExperts::drop_own_saved(ActivationCheckpoint what) {
  // fp8: X's amaxes go with the values; the weight grads take those of the remade ones.
  if (what == ActivationCheckpoint::Selective) saved_act_ = Tensor{}, fp8_x2_.clear();
  if (what == ActivationCheckpoint::Full)
    saved_x_ = saved_h_ = saved_act_ = Tensor{}, fp8_x13_.clear(), fp8_x2_.clear();
}

void GroupedExperts::release_held_grads(RunContext& ctx) {
  if (held_.empty()) return;
  params()[1]->set_grad(ctx, std::move(held_[0]));
  params()[0]->set_grad(ctx, std::move(held_[1]));
  held_.clear();
}

// ---- MoeFeedForward

MoeFeedForward::MoeFeedForward(const TransformerConfig& c, const MoeConfig& m, int layer)
    : Module("MoeFeedForward"), config_(m) {
  m.validate();
  router_ = &add_child(
      "router", std::make_unique<Linear>(
                    c.dim, m.experts,
                    normal_init_fn(transformer_param_seed(c.seed, layer, static_cast<InitRole>(kExpertRoleBase + 1)),
                                m.experts * c.dim, kTransformerInitStd)));
  experts_ = &add_child("experts", std::make_unique<GroupedExperts>(c, m, layer));
}

Tensor MoeFeedForward::forward_impl(RunContext& ctx, const Tensor& x) {
  Device& d = *ctx.device;
  const int64_t tokens = x.rows, dim = x.cols;
  const int E = config_.experts;
  FSDP_CHECK(!ep_ || ep_->size() == config_.ep, "MoE layer ", fqn(), " was built for ep ",
             config_.ep, " but its ep communicator has ", ep_->size(), " ranks");
  FSDP_CHECK(config_.ep == 1 || ep_, "MoE layer ", fqn(), " needs its ep communicator (ep ",
             config_.ep, ")");
  Tensor logits = router_->forward(ctx, x);
  probs_ = empty_tensor(d, ctx.compute, DType::F32, tokens, E, MemTag::Activation);
  d.set_label(op_label("fwd", "router softmax"));
  d.softmax_rows(ctx.compute, logits.data, logits.dtype, probs_.as<float>(), tokens, E);
  logits = Tensor{};
  // Kept across steps (stats()): made by the first forward, before any graph capture.
  if (!stats_.defined()) stats_ = empty_tensor(d, ctx.compute, DType::F32, 1, 2, MemTag::Other);
  // Note [MoE routing]: static shapes route on the device; padding slots (static shapes) read
  // token `tokens`, a zero row past the real ones.
  padded_ = config_.capacity_factor > 0;
  if (padded_)
    route_on_device(ctx, tokens);
  else
    route_on_host(ctx, tokens);
  const int64_t sent = dispatcher_.sent_rows();

  d.set_label(op_label("fwd", "moe gather"));
  Tensor expert_in = dispatcher_.to_experts(
      ctx, gather_rows(ctx, padded_ ? with_zero_row(ctx, x) : x, send_tokens_, sent, dim), dim);
  experts_->counts = dispatcher_.local_counts();
  Tensor expert_out = experts_->forward(ctx, expert_in);
  expert_in = Tensor{};
  combined_ = dispatcher_.from_experts(ctx, expert_out, dim);
  expert_out = Tensor{};
  Tensor weighted = new_act(ctx, sent, dim);
  d.set_label(op_label("fwd", "moe combine"));
  if (sent > 0)
    d.scale_rows(ctx.compute, weighted.data, combined_.data, ctx.act_dtype, send_weights_.as<float>(),
                 1, sent, dim, false);
  Tensor y = scatter_add_rows(ctx, weighted, send_tokens_, sent, dim, tokens + (padded_ ? 1 : 0));
  y.rows = tokens;  // the padding row (weight 0) is left out
  return y;
}

// Note [Device MoE routing]: the send order, its tokens and weights, and what the backward
// needs, all on the device; the layout of the exchange from the shapes alone.
void MoeFeedForward::route_on_device(RunContext& ctx, int64_t tokens) {
  Device& d = *ctx.device;
  const int E = config_.experts, K = config_.top_k;
  const int64_t group = config_.group_tokens > 0 ? config_.group_tokens : std::max<int64_t>(tokens, 1);
  FSDP_CHECK(tokens % group == 0, "MoE routing: ", tokens, " rows do not split into groups of ",
             group, " tokens");
  Device::MoeRouting& r = routing_;
  r = Device::MoeRouting{};
  r.probs = probs_.as<float>();
  r.tokens = tokens;
  r.experts = E;
  r.top_k = K;
  r.group_tokens = group;
  r.capacity = std::max<int64_t>(config_.capacity(group), 1);
  r.aux_loss_weight = config_.aux_loss_weight;
  const int64_t rows = E * r.slots();
  auto ids = [&](int64_t n) { return empty_tensor(d, ctx.compute, DType::I32, n, 1, MemTag::Activation); };
  auto floats = [&](int64_t n) { return empty_tensor(d, ctx.compute, DType::F32, n, 1, MemTag::Activation); };
  chosen_ = ids(tokens * K);
  weights_ = floats(tokens * K);
  slots_ = ids(tokens * K);
  Tensor send_assignment = ids(rows);
  send_tokens_ = ids(rows);
  send_weights_ = floats(rows);
  aux_grad_ = floats(r.groups() * E);
  r.chosen = chosen_.as<int32_t>();
  r.weight = weights_.as<float>();
  r.slot = slots_.as<int32_t>();
  r.send_assignment = send_assignment.as<int32_t>();
  r.send_token = send_tokens_.as<int32_t>();
  r.send_weight = send_weights_.as<float>();
  r.aux_grad = aux_grad_.as<float>();
  r.stats = stats_.as<float>();
  d.set_label(op_label("fwd", "moe routing"));
  d.moe_route(ctx.compute, r);
  dispatcher_.plan_static(ctx, ep_, E, r.slots());
}

// Dropless: the row counts depend on the routing, which the host needs for the exchange.
void MoeFeedForward::route_on_host(RunContext& ctx, int64_t tokens) {
  Device& d = *ctx.device;
  const int E = config_.experts, K = config_.top_k;
  probs_host_.resize(static_cast<size_t>(tokens * E));
  d.copy_to_host(ctx.compute, probs_host_.data(), probs_.data, probs_host_.size() * sizeof(float));
  d.synchronize_stream(ctx.compute);  // Note [MoE routing]: dropless routing runs on the host
  plan_ = route_tokens(probs_host_, tokens, config_);
  const float stats[2] = {plan_.aux_loss, plan_.max_load};
  d.copy_from_host(ctx.compute, stats_.data, stats, sizeof(stats));
  dispatcher_.plan(ctx, ep_, E, plan_.expert);
  const std::vector<int32_t>& order = dispatcher_.send_assignments();
  const int64_t sent = dispatcher_.sent_rows();
  std::vector<int32_t> token(order.size());
  std::vector<float> weight(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    token[i] = order[i] >= 0 ? order[i] / K : static_cast<int32_t>(tokens);
    weight[i] = order[i] >= 0 ? plan_.weight[static_cast<size_t>(order[i])] : 0.0f;
  }
  send_tokens_ = device_ids(ctx, token);
  send_weights_ = empty_tensor(d, ctx.compute, DType::F32, sent, 1, MemTag::Activation);
  if (sent > 0) d.copy_from_host(ctx.compute, send_weights_.data, weight.data(), send_weights_.bytes());
}

Tensor MoeFeedForward::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  Device& d = *ctx.device;
  const int64_t tokens = dy.rows, dim = dy.cols;
  const int E = config_.experts;
  const int64_t sent = dispatcher_.sent_rows();
  // y = sum_i w_i z_i: dz_i = w_i dy[token_i], dw_i = <dy[token_i], z_i>.
  d.set_label(op_label("bwd", "moe combine"));
  Tensor dy_sent = gather_rows(ctx, padded_ ? with_zero_row(ctx, dy) : dy, send_tokens_, sent, dim);
  Tensor dweight = empty_tensor(d, ctx.compute, DType::F32, sent, 1, MemTag::Activation);
  Tensor dz = new_act(ctx, sent, dim);
  if (sent > 0) {
    d.row_dot(ctx.compute, dy_sent.data, combined_.data, ctx.act_dtype, dweight.as<float>(), 1,
              sent, dim);
    d.scale_rows(ctx.compute, dz.data, dy_sent.data, ctx.act_dtype, send_weights_.as<float>(), 1,
                 sent, dim, false);
  }
  dy_sent = combined_ = Tensor{};
  Tensor dexpert_out = dispatcher_.to_experts(ctx, dz, dim);  // from_experts' backward
  dz = Tensor{};
  Tensor dexpert_in = experts_->backward(ctx, dexpert_out);
  dexpert_out = Tensor{};
  Tensor dx_sent = dispatcher_.from_experts(ctx, dexpert_in, dim);  // to_experts' backward
  dexpert_in = Tensor{};
  d.set_label(op_label("bwd", "moe gather"));
  Tensor dx = scatter_add_rows(ctx, dx_sent, send_tokens_, sent, dim, tokens + (padded_ ? 1 : 0));
  dx.rows = tokens;
  dx_sent = Tensor{};

  // The router: through the renormalized top-k weights and the auxiliary loss.
  Tensor dprobs;
  if (padded_) {
    dprobs = empty_tensor(d, ctx.compute, DType::F32, tokens, E, MemTag::Activation);
    d.set_label(op_label("bwd", "moe routing"));
    d.moe_route_backward(ctx.compute, routing_, dweight.as<float>(), dprobs.as<float>());
    routing_ = Device::MoeRouting{};
    chosen_ = weights_ = slots_ = aux_grad_ = Tensor{};
  } else {
    dprobs = router_grad_on_host(ctx, dweight, tokens);
  }
  dweight = Tensor{};
  Tensor dlogits = new_act(ctx, tokens, E);
  d.set_label(op_label("bwd", "router softmax"));
  d.softmax_rows_backward(ctx.compute, probs_.as<float>(), dprobs.as<float>(), dlogits.data,
                          ctx.act_dtype, tokens, E);
  probs_ = dprobs = Tensor{};
  Tensor dx_router = router_->backward(ctx, dlogits);
  d.set_label(op_label("bwd", "residual"));
  d.add(ctx.compute, dx.data, dx.data, dx_router.data, ctx.act_dtype, dx.numel());
  send_tokens_ = send_weights_ = Tensor{};
  return dx;
}

void MoeFeedForward::drop_own_saved(ActivationCheckpoint what) {
  if (what != ActivationCheckpoint::Full) return;  // selective keeps the routing and the rows
  routing_ = Device::MoeRouting{};
  chosen_ = weights_ = slots_ = aux_grad_ = probs_ = combined_ = send_tokens_ = send_weights_ =
      Tensor{};
  plan_ = RoutePlan{};
  std::vector<float>().swap(probs_host_);
}

// Dropless: the router's gradient on the host, from the weights' gradients read back.
Tensor MoeFeedForward::router_grad_on_host(RunContext& ctx, const Tensor& dweight, int64_t tokens) {
  Device& d = *ctx.device;
  const int E = config_.experts, K = config_.top_k;
  const int64_t sent = dispatcher_.sent_rows();
  std::vector<float> dw(static_cast<size_t>(sent));
  if (sent > 0) d.copy_to_host(ctx.compute, dw.data(), dweight.data, dw.size() * sizeof(float));
  d.synchronize_stream(ctx.compute);
  std::vector<float> dw_assignment(static_cast<size_t>(tokens * K), 0.0f);
  const std::vector<int32_t>& order = dispatcher_.send_assignments();
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i] >= 0) dw_assignment[static_cast<size_t>(order[i])] = dw[i];
  std::vector<float> dprobs(static_cast<size_t>(tokens * E), 0.0f);
  const int64_t group = config_.group_tokens > 0 ? config_.group_tokens : tokens;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* p = probs_host_.data() + t * E;
    float* dp = dprobs.data() + t * E;
    const float* aux = plan_.aux_grad.data() + (t / group) * E;
    for (int e = 0; e < E; ++e) dp[e] = aux[e];
    // w_j = p_j / S over the top-k: dL/dp_j = (dw_j - sum_k dw_k w_k) / S.
    float sum = 0, dot = 0;
    for (int k = 0; k < K; ++k) {
      const size_t a = static_cast<size_t>(t * K + k);
      sum += p[plan_.chosen[a]];
      dot += dw_assignment[a] * plan_.weight[a];
    }
    for (int k = 0; k < K; ++k) {
      const size_t a = static_cast<size_t>(t * K + k);
      dp[plan_.chosen[a]] += (dw_assignment[a] - dot) / sum;
    }
  }
  Tensor out = empty_tensor(d, ctx.compute, DType::F32, tokens, E, MemTag::Activation);
  d.copy_from_host(ctx.compute, out.data, dprobs.data(), out.bytes());
  return out;
}

// ---- MoeTransformerBlock

MoeTransformerBlock::MoeTransformerBlock(const TransformerConfig& c, const MoeConfig& m, int layer)
    : Module("MoeTransformerBlock") {
  attention_norm_ = &add_child("attention_norm", std::make_unique<RMSNorm>(c.dim, c.norm_eps));
  attention_ = &add_child("attention", std::make_unique<Attention>(c, layer));
  ffn_norm_ = &add_child("ffn_norm", std::make_unique<RMSNorm>(c.dim, c.norm_eps));
  moe_ = &add_child("moe", std::make_unique<MoeFeedForward>(c, m, layer));
  // Note [Fused amax]: wqkv reads attention_norm's output; wo reads ffn_norm's input gradient
  // dh as its dY (the router, ffn_norm's reader, is not an fp8 GEMM).
  attention_norm_->set_fp8_output_reader(&attention_->input_projection().weight());
  ffn_norm_->set_fp8_input_grad_reader(&attention_->output_projection().weight());
}

void MoeTransformerBlock::set_input_grad_reader(const Param* w) {
  attention_norm_->set_fp8_input_grad_reader(w);
}

// As the dense block: the first residual add runs fused into ffn_norm, and both backward
// residual adds into the norms' backward.
Tensor MoeTransformerBlock::forward_impl(RunContext& ctx, const Tensor& x) {
  Device& d = *ctx.device;
  Tensor attn = attention_->forward(ctx, attention_norm_->forward(ctx, x));
  Tensor h;
  Tensor normed = ffn_norm_->forward_add(ctx, x, attn, h);  // h = x + attn
  attn = Tensor{};
  Tensor ffn = moe_->forward(ctx, normed);
  normed = Tensor{};
  Tensor out = new_act(ctx, x.rows, x.cols);
  d.set_label(op_label("fwd", "residual"));
  d.add(ctx.compute, out.data, h.data, ffn.data, ctx.act_dtype, out.numel());
  return out;
}

void MoeTransformerBlock::drop_own_saved(ActivationCheckpoint what) {
  if (what != ActivationCheckpoint::Selective) return;
  attention_->input_projection().drop_saved_input();  // attention_norm's output
  moe_->router().drop_saved_input();                  // ffn_norm's output
}

Tensor MoeTransformerBlock::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  // A norm output that a selective checkpoint dropped is made again just before its
  // branch's backward.
  ffn_norm_->remake_output_for(ctx, moe_->router());
  Tensor dh = ffn_norm_->backward_add(ctx, moe_->backward(ctx, dy), dy);
  attention_norm_->remake_output_for(ctx, attention_->input_projection());
  Tensor dx = attention_norm_->backward_add(ctx, attention_->backward(ctx, dh), dh);
  // Dense group first (MoeGradOrder::DenseFirst): the experts' grads were held until now.
  if (moe_->experts().hold_grads && !defer_expert_grads_to_root) moe_->experts().release_held_grads(ctx);
  return dx;
}

}  // namespace fsdp::nn
