// The transformer's config, init and its smaller modules: Embedding, RMSNorm, FeedForward and
// the block. Attention is in transformer_attention.cpp.
#include "fsdp/nn/transformer.h"

#include <cmath>
#include <numbers>

#include "fsdp/error.h"
#include "fsdp/synthetic.h"
#include "fsdp/nn/layers.h"
#include "nn/fp8_linear.h"
#include "nn/host_chunks.h"

namespace fsdp::nn {

namespace {

Tensor new_act(RunContext& ctx, int64_t rows, int64_t cols) {
  return empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, rows, cols, MemTag::Activation);
}

}  // namespace

// ---- config, counts, init

// Note [Options checked once]: the options by their ModelConfig names.
void TransformerConfig::validate() const {
  const OptionName dim_{"dim"}, heads_{"heads"}, kv_heads_{"kv_heads"}, vocab_{"vocab"},
      head_dim_{"head_dim"}, rope_theta_{"rope_theta"}, rope_scaling_{"rope_scaling"};
  FSDP_OPTION_CHECK(layers >= 1, OptionName{"layers"}, " must be >= 1, got ", layers);
  FSDP_OPTION_CHECK(dim >= 1 && heads >= 1 && kv_heads >= 1 && ffn_dim >= 1 && seq_len >= 1 &&
                        vocab >= 1,
                    "transformer sizes must be positive: ", dim_, " ", dim, ", ", heads_, " ",
                    heads, ", ", kv_heads_, " ", kv_heads, ", ", OptionName{"ffn_dim"}, " ",
                    ffn_dim, ", ", OptionName{"seq_len"}, " ", seq_len, ", ", vocab_, " ", vocab);
  FSDP_OPTION_CHECK(head_size >= 0, head_dim_, " must be >= 1 (or 0: ", dim_, " / ", heads_,
                    "), got ", head_size);
  FSDP_OPTION_CHECK(head_size > 0 || dim % heads == 0, dim_, " (", dim,
                    ") must be a multiple of ", heads_, " (", heads, ")");
  if (head_size > 0)
    FSDP_OPTION_CHECK(head_dim() % 2 == 0, head_dim_, " (", head_dim(),
                      ") must be even for rotary embeddings");
  else
    FSDP_OPTION_CHECK(head_dim() % 2 == 0, "the head dim (", dim_, " / ", heads_, " = ",
                      head_dim(), ") must be even for rotary embeddings");
  FSDP_OPTION_CHECK(std::isfinite(rope_theta) && rope_theta > 1, rope_theta_,
                    " must be a number > 1, got ", rope_theta);
  FSDP_OPTION_CHECK(std::isfinite(norm_eps) && norm_eps > 0, OptionName{"norm_eps"},
                    " must be > 0, got ", norm_eps);
  const RopeScaling& r = rope_scaling;
  FSDP_OPTION_CHECK(r.type == "default" || r.type == "llama3", rope_scaling_, " type '", r.type,
                    "' is not implemented (default and llama3 are)");
  if (r.type == "llama3") {
    FSDP_OPTION_CHECK(std::isfinite(r.factor) && r.factor >= 1, OptionName{"rope_factor"},
                      " must be >= 1, got ", r.factor);
    FSDP_OPTION_CHECK(std::isfinite(r.low_freq_factor) && std::isfinite(r.high_freq_factor) &&
                          r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor,
                      rope_scaling_, " needs 0 < ", OptionName{"rope_low_freq_factor"}, " < ",
                      OptionName{"rope_high_freq_factor"}, ", got ", r.low_freq_factor, " and ",
                      r.high_freq_factor);
    FSDP_OPTION_CHECK(r.original_max_positions >= 1, OptionName{"rope_original_max_positions"},
                      " must be >= 1, got ", r.original_max_positions);
  }
  FSDP_OPTION_CHECK(heads % kv_heads == 0, heads_, " (", heads, ") must be a multiple of ",
                    kv_heads_, " (", kv_heads, ")");
  FSDP_OPTION_CHECK(vocab <= INT32_MAX, vocab_, " must fit token ids in int32, got ", vocab);
}

int64_t transformer_param_count(const TransformerConfig& c) {
  const int64_t hd = c.head_dim();
  const int64_t per_layer = c.dim * (c.heads + 2 * c.kv_heads) * hd  // wqkv
                            + (c.attention_bias ? (c.heads + 2 * c.kv_heads) * hd : 0) +
                            c.heads * hd * c.dim     // wo
                            + 3 * c.dim * c.ffn_dim  // w13, w2
                            + 2 * c.dim;             // the two norms
  return (c.tie_embeddings ? 1 : 2) * c.vocab * c.dim + c.dim + c.layers * per_layer;
}

std::vector<float> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& r) {
  // fp32 throughout, the operations in the order of Hugging Face's (its tensors are fp32 and
  // its Python scalars enter each operation as fp32).
  const int64_t half = head_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] =
        1.0f / std::pow(static_cast<float>(theta),
                        static_cast<float>(2 * i) / static_cast<float>(head_dim));
  if (r.type != "llama3") return f;
  const float factor = static_cast<float>(r.factor), lo = static_cast<float>(r.low_freq_factor);
  const float band = static_cast<float>(r.high_freq_factor - r.low_freq_factor);
  const double old_len = static_cast<double>(r.original_max_positions);
  const float low_freq_wavelen = static_cast<float>(old_len / r.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_len / r.high_freq_factor);
  for (float& v : f) {
    const float wavelen = static_cast<float>(2 * std::numbers::pi) / v;
    if (wavelen > low_freq_wavelen) {
      v = v / factor;
    } else if (!(wavelen < high_freq_wavelen)) {
      const float smooth = (static_cast<float>(old_len) / wavelen - lo) / band;
      v = (1 - smooth) * v / factor + smooth * v;
    }
  }
  return f;
}

double transformer_flops_per_token(const TransformerConfig& c) {
  const double gemm_params = static_cast<double>(transformer_param_count(c) - c.vocab * c.dim);
  return 6.0 * gemm_params +
         12.0 * c.layers * static_cast<double>(c.heads * c.head_dim()) * c.seq_len;
}

std::vector<float> normal_init(uint64_t seed, int64_t n, float std) {
  // Box-Muller on the pair (2m, 2m+1) of the stream gives elements 2m and 2m+1.
  std::vector<float> v(static_cast<size_t>(n));
  const uint64_t state = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  // Pairs in parallel (Note [Initial values in parallel] in nn/host_chunks.h).
  for_each_host_chunk((n + 1) / 2, int64_t{1} << 18, [&](int64_t first, int64_t last) {
    for (int64_t m = first; m < last; ++m) {
      const double u1 = static_cast<double>((splitmix64_at(state, 2 * m) >> 11) + 1) * 0x1p-53;
      const double u2 = static_cast<double>(splitmix64_at(state, 2 * m + 1) >> 11) * 0x1p-53;
      const double radius = std::sqrt(-2.0 * std::log(u1)) * std;
      const double angle = 2.0 * std::numbers::pi * u2;
      v[static_cast<size_t>(2 * m)] = static_cast<float>(radius * std::cos(angle));
      if (2 * m + 1 < n) v[static_cast<size_t>(2 * m + 1)] = static_cast<float>(radius * std::sin(angle));
    }
  });
  return v;
}

ParamInit normal_init_fn(uint64_t seed, int64_t n, float std) {
  return [=] { return normal_init(seed, n, std); };
}

float residual_projection_init_std(int layer) {
  return kTransformerInitStd / std::sqrt(2.0f * static_cast<float>(layer + 1));
}

uint64_t transformer_param_seed(uint64_t seed, int layer, InitRole role) {
  return splitmix64_at(seed, static_cast<uint64_t>(layer + 1) * 16 + static_cast<uint64_t>(role));
}

// ---- Embedding

Embedding::Embedding(int64_t vocab, int64_t dim, uint64_t seed)
    : Module("Embedding"), vocab_(vocab), dim_(dim) {
  FSDP_CHECK(vocab >= 1 && dim >= 1, "Embedding(", vocab, ", ", dim, "): sizes must be positive");
  add_param("weight", {vocab, dim},
            normal_init_fn(seed, vocab * dim, kTransformerInitStd));
}

Tensor Embedding::forward_impl(RunContext& ctx, const Tensor& ids) {
  FSDP_CHECK(ids.dtype == DType::I32 && ids.cols == 1, "Embedding ", fqn(),
             " expects int32 token ids [tokens, 1], got ", dtype_name(ids.dtype), " [", ids.rows,
             ", ", ids.cols, "]");
  Tensor y = new_act(ctx, ids.rows, dim_);
  ctx.device->set_label(op_label("fwd", "embedding"));
  ctx.device->embedding_forward(ctx.compute, weight().value.data, ctx.act_dtype,
                                ids.as<int32_t>(), ids.rows, dim_, y.data);
  saved_ids_ = ids;
  return y;
}

void Embedding::drop_own_saved(ActivationCheckpoint what) {
  if (what == ActivationCheckpoint::Full) saved_ids_ = Tensor{};
}

Tensor Embedding::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  Tensor dw = empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, vocab_, dim_, MemTag::Grad);
  ctx.device->set_label(op_label("bwd", "embedding"));
  ctx.device->embedding_backward(ctx.compute, dy.data, ctx.act_dtype, saved_ids_.as<int32_t>(),
                                 dy.rows, dim_, vocab_, dw.data);
  saved_ids_ = Tensor{};
  weight().set_grad(ctx, std::move(dw));
  return Tensor{};  // token ids have no gradient
}

// ---- TiedHead (Note [Tied embeddings])

TiedHead::TiedHead(Param& embedding_weight)
    : Module("TiedHead"),
      weight_(embedding_weight),
      vocab_(embedding_weight.rows()),
      dim_(embedding_weight.cols()) {
  weight_.add_use();
}

Tensor TiedHead::forward_impl(RunContext& ctx, const Tensor& x) {
  FSDP_CHECK(x.cols == dim_, "TiedHead ", fqn(), " expects ", dim_, " features, got ", x.cols);
  FSDP_CHECK(weight_.value.defined(), "TiedHead ", fqn(),
             ": the embedding's weight is not gathered");
  Tensor y = new_act(ctx, x.rows, vocab_);
  ctx.device->set_label(op_label("fwd", "gemm"));
  ctx.device->gemm(ctx.compute, false, true, x.rows, vocab_, dim_, 1.0f, x.data, weight_.value.data,
                   ctx.act_dtype, 0.0f, y.data, y.dtype);
  saved_x_ = x;
  return y;
}

Tensor TiedHead::backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) {
  Device& d = *ctx.device;
  Tensor dx;
  if (input_grad) {
    dx = new_act(ctx, dy.rows, dim_);
    d.set_label(op_label("bwd", "gemm dX"));
    d.gemm(ctx.compute, false, false, dy.rows, dim_, vocab_, 1.0f, dy.data, weight_.value.data,
           ctx.act_dtype, 0.0f, dx.data, dx.dtype);
  }
  Tensor dw = empty_tensor(d, ctx.compute, ctx.act_dtype, vocab_, dim_, MemTag::Grad);
  d.set_label(op_label("bwd", "gemm dW"));
  d.gemm(ctx.compute, true, false, vocab_, dim_, dy.rows, 1.0f, dy.data, saved_x_.data,
         ctx.act_dtype, 0.0f, dw.data, dw.dtype);
  saved_x_ = Tensor{};
  weight_.set_grad(ctx, std::move(dw));  // the first of its two (Note [Tied embeddings])
  return dx;
}

// ---- RMSNorm

RMSNorm::RMSNorm(int64_t dim, float eps) : Module("RMSNorm"), dim_(dim), eps_(eps) {
  FSDP_CHECK(dim >= 1, "RMSNorm(", dim, "): size must be positive");
  add_param("weight", {dim}, [dim] { return std::vector<float>(static_cast<size_t>(dim), 1.0f); });
}

Tensor RMSNorm::forward_impl(RunContext& ctx, const Tensor& x) {
  FSDP_CHECK(x.cols == dim_, "RMSNorm ", fqn(), " expects ", dim_, " features, got ", x.cols);
  Device& d = *ctx.device;
  Tensor y = new_act(ctx, x.rows, dim_);
  Tensor rstd = empty_tensor(d, ctx.compute, DType::F32, x.rows, 1, MemTag::Activation);
  d.set_label(op_label("fwd", "rmsnorm"));
  float* amax = attach_fused_amax(ctx, output_reader_, y);
  d.rms_norm_forward(ctx.compute, x.data, weight().value.data, ctx.act_dtype, x.rows, dim_, eps_,
                     y.data, rstd.as<float>(), amax);
  saved_x_ = x;
  saved_rstd_ = std::move(rstd);
  return y;
}

Tensor RMSNorm::forward_add(RunContext& ctx, const Tensor& x, const Tensor& residual, Tensor& h) {
  FSDP_CHECK(x.cols == dim_ && residual.rows == x.rows && residual.cols == dim_, "RMSNorm ", fqn(),
             " expects two [rows, ", dim_, "] inputs, got [", x.rows, ", ", x.cols, "] and [",
             residual.rows, ", ", residual.cols, "]");
  if (hooks) hooks->pre_forward(ctx);
  Device& d = *ctx.device;
  h = new_act(ctx, x.rows, dim_);
  Tensor y = new_act(ctx, x.rows, dim_);
  Tensor rstd = empty_tensor(d, ctx.compute, DType::F32, x.rows, 1, MemTag::Activation);
  d.set_label(op_label("fwd", "residual+rmsnorm"));
  float* amax = attach_fused_amax(ctx, output_reader_, y);
  d.add_rms_norm_forward(ctx.compute, x.data, residual.data, weight().value.data, ctx.act_dtype,
                         x.rows, dim_, eps_, h.data, y.data, rstd.as<float>(), amax);
  saved_x_ = h;
  saved_rstd_ = std::move(rstd);
  if (hooks) hooks->post_forward(ctx);
  return y;
}

void RMSNorm::drop_own_saved(ActivationCheckpoint what) {
  if (what != ActivationCheckpoint::Full) return;
  saved_x_ = Tensor{};
  saved_rstd_ = Tensor{};
}

void RMSNorm::remake_output_for(RunContext& ctx, Linear& consumer) {
  if (consumer.has_saved_input()) return;
  FSDP_CHECK(saved_x_.defined(), "RMSNorm ", fqn(), ": no kept input to remake the output from");
  Device& d = *ctx.device;
  Tensor y = new_act(ctx, saved_x_.rows, dim_);
  Tensor rstd = empty_tensor(d, ctx.compute, DType::F32, saved_x_.rows, 1, MemTag::Activation);
  d.set_label(op_label("recompute", "rmsnorm"));
  float* amax = attach_fused_amax(ctx, output_reader_, y);
  d.rms_norm_forward(ctx.compute, saved_x_.data, weight().value.data, ctx.act_dtype,
                     saved_x_.rows, dim_, eps_, y.data, rstd.as<float>(), amax);
  saved_rstd_ = std::move(rstd);  // the same values as the one it replaces
  consumer.restore_saved_input(std::move(y));
}

Tensor RMSNorm::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  return backward_common(ctx, dy, nullptr);
}

Tensor RMSNorm::backward_add(RunContext& ctx, const Tensor& dy, const Tensor& dresidual) {
  FSDP_CHECK(dresidual.rows == dy.rows && dresidual.cols == dim_, "RMSNorm ", fqn(),
             ": the residual gradient is [", dresidual.rows, ", ", dresidual.cols,
             "], not [", dy.rows, ", ", dim_, "]");
  if (hooks) hooks->pre_backward(ctx);
  Tensor dx = backward_common(ctx, dy, &dresidual);
  if (hooks) hooks->post_backward(ctx);
  return dx;
}

Tensor RMSNorm::backward_common(RunContext& ctx, const Tensor& dy, const Tensor* dresidual) {
  Device& d = *ctx.device;
  Tensor dx = new_act(ctx, dy.rows, dim_);
  Tensor dw = empty_tensor(d, ctx.compute, ctx.act_dtype, dim_, 1, MemTag::Grad);
  float* amax = attach_fused_amax(ctx, input_grad_reader_, dx);
  if (dresidual) {
    d.set_label(op_label("bwd", "rmsnorm+residual"));
    d.rms_norm_backward_add(ctx.compute, saved_x_.data, weight().value.data,
                            saved_rstd_.as<float>(), dy.data, dresidual->data, ctx.act_dtype,
                            dy.rows, dim_, dx.data, dw.data, amax);
  } else {
    d.set_label(op_label("bwd", "rmsnorm"));
    d.rms_norm_backward(ctx.compute, saved_x_.data, weight().value.data, saved_rstd_.as<float>(),
                        dy.data, ctx.act_dtype, dy.rows, dim_, dx.data, dw.data, amax);
  }
  saved_x_ = Tensor{};
  saved_rstd_ = Tensor{};
  weight().set_grad(ctx, std::move(dw));
  return dx;
}

// ---- FeedForward

FeedForward::FeedForward(int64_t dim, int64_t ffn_dim, uint64_t seed, float w2_std)
    : Module("FeedForward"), ffn_dim_(ffn_dim) {
  w13_ = &add_child("w13", std::make_unique<Linear>(
                               dim, 2 * ffn_dim,
                               normal_init_fn(seed * 2 + 1, 2 * ffn_dim * dim, kTransformerInitStd)));
  w2_ = &add_child("w2", std::make_unique<Linear>(ffn_dim, dim,
                                                  normal_init_fn(seed * 2 + 2, dim * ffn_dim, w2_std)));
}

Tensor FeedForward::swiglu(RunContext& ctx, const Tensor& x) {
  Tensor h13 = w13_->forward(ctx, x);
  Tensor act = new_act(ctx, x.rows, ffn_dim_);
  float* amax = attach_fused_amax(ctx, w2_->weight(), act);  // Note [Fused amax]
  ctx.device->set_label(op_label("fwd", "swiglu"));
  ctx.device->swiglu_forward(ctx.compute, h13.data, ctx.act_dtype, x.rows, ffn_dim_, act.data,
                             amax);
  saved_h13_ = std::move(h13);
  return act;
}

Tensor FeedForward::forward_impl(RunContext& ctx, const Tensor& x) {
  return w2_->forward(ctx, swiglu(ctx, x));
}

void FeedForward::recompute_impl(RunContext& ctx, const Tensor& x) {
  recompute_child(ctx, *w2_, swiglu(ctx, x));
}

void FeedForward::drop_own_saved(ActivationCheckpoint what) {
  if (what == ActivationCheckpoint::Full) saved_h13_ = Tensor{};
  if (what == ActivationCheckpoint::Selective) w2_->drop_saved_input();
}

Tensor FeedForward::backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) {
  if (!w2_->has_saved_input()) {  // Note [Activation checkpointing]: selective dropped it
    Tensor act = new_act(ctx, dy.rows, ffn_dim_);
    ctx.device->set_label(op_label("recompute", "swiglu"));
    ctx.device->swiglu_forward(ctx.compute, saved_h13_.data, ctx.act_dtype, dy.rows, ffn_dim_,
                               act.data, nullptr);  // the weight grad reuses the forward's amax
    w2_->restore_saved_input(std::move(act));
  }
  Tensor dact = w2_->backward(ctx, dy);
  Tensor dh13 = new_act(ctx, dy.rows, 2 * ffn_dim_);
  float* amax = attach_fused_amax(ctx, w13_->weight(), dh13);  // Note [Fused amax]
  ctx.device->set_label(op_label("bwd", "swiglu"));
  ctx.device->swiglu_backward(ctx.compute, saved_h13_.data, dact.data, ctx.act_dtype, dy.rows,
                              ffn_dim_, dh13.data, amax);
  saved_h13_ = Tensor{};
  return w13_->backward(ctx, dh13, input_grad);
}

// ---- TransformerBlock

TransformerBlock::TransformerBlock(const TransformerConfig& c, int layer)
    : Module("TransformerBlock") {
  attention_norm_ = &add_child("attention_norm", std::make_unique<RMSNorm>(c.dim, c.norm_eps));
  attention_ = &add_child("attention", std::make_unique<Attention>(c, layer));
  ffn_norm_ = &add_child("ffn_norm", std::make_unique<RMSNorm>(c.dim, c.norm_eps));
  const uint64_t ffn_seed = transformer_param_seed(c.seed, layer, InitRole::FeedForward);
  feed_forward_ = &add_child("feed_forward",
                             std::make_unique<FeedForward>(c.dim, c.ffn_dim, ffn_seed,
                                                           residual_projection_init_std(layer)));
  // Note [Fused amax]: wqkv reads attention_norm's output, w13 ffn_norm's; wo reads ffn_norm's
  // input gradient dh (the residual's gradient) as its dY.
  attention_norm_->set_fp8_output_reader(&attention_->input_projection().weight());
  ffn_norm_->set_fp8_output_reader(&feed_forward_->input_projection().weight());
  ffn_norm_->set_fp8_input_grad_reader(&attention_->output_projection().weight());
}

void TransformerBlock::set_input_grad_reader(const Param* w) {
  attention_norm_->set_fp8_input_grad_reader(w);
}

const Param* TransformerBlock::output_projection_weight() const {
  return &feed_forward_->output_projection().weight();
}

Tensor TransformerBlock::forward_impl(RunContext& ctx, const Tensor& x) {
  return forward_with(ctx, x, [&](const Tensor& normed) { return attention_->forward(ctx, normed); });
}

Tensor TransformerBlock::forward_cached(RunContext& ctx, const Tensor& x, LayerKvCache& cache,
                                        int64_t position) {
  return forward_with(ctx, x, [&](const Tensor& normed) {
    return attention_->forward_cached(ctx, normed, cache, position);
  });
}

template <typename Attend>
Tensor TransformerBlock::ffn_input(RunContext& ctx, const Tensor& x, Attend&& attend, Tensor& h) {
  Tensor attn = attend(attention_norm_->forward(ctx, x));
  return ffn_norm_->forward_add(ctx, x, attn, h);  // h = x + attn
}

void TransformerBlock::recompute_impl(RunContext& ctx, const Tensor& x) {
  Tensor h;
  Tensor normed = ffn_input(
      ctx, x, [&](const Tensor& n) { return attention_->forward(ctx, n); }, h);
  recompute_child(ctx, *feed_forward_, normed);
}

template <typename Attend>
Tensor TransformerBlock::forward_with(RunContext& ctx, const Tensor& x, Attend&& attend) {
  Device& d = *ctx.device;
  Tensor h;
  Tensor normed = ffn_input(ctx, x, attend, h);
  Tensor ffn = feed_forward_->forward(ctx, normed);
  normed = Tensor{};
  Tensor out = new_act(ctx, x.rows, x.cols);
  d.set_label(op_label("fwd", "residual"));
  d.add(ctx.compute, out.data, h.data, ffn.data, ctx.act_dtype, out.numel());
  return out;
}

void TransformerBlock::drop_own_saved(ActivationCheckpoint what) {
  if (what != ActivationCheckpoint::Selective) return;
  attention_->input_projection().drop_saved_input();     // attention_norm's output
  feed_forward_->input_projection().drop_saved_input();  // ffn_norm's output
}

Tensor TransformerBlock::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  // Every branch needs its input's gradient (the norms' weight grads come with it), so the
  // block's d(input) costs nothing extra and is always returned. Each residual add's backward
  // (dh = dy + ..., dx = dh + ...) runs inside the norm's backward. A norm output that a
  // selective checkpoint dropped is made again just before its branch's backward.
  ffn_norm_->remake_output_for(ctx, feed_forward_->input_projection());
  Tensor dh = ffn_norm_->backward_add(ctx, feed_forward_->backward(ctx, dy), dy);
  attention_norm_->remake_output_for(ctx, attention_->input_projection());
  return attention_norm_->backward_add(ctx, attention_->backward(ctx, dh), dh);
}

}  // namespace fsdp::nn
