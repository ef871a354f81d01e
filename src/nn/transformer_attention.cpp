// Causal grouped-query self-attention with rotary embeddings (Note [Transformer layout]).
// Forward: qkv = wqkv(x) [tokens, (heads + 2 kv_heads) head_dim]; RoPE in place on its q and k
// columns; the attention op reads q, k and v as column slices of qkv (row stride = its width);
// out = wo(attention). Backward mirrors it, with d(qkv) written as the same three slices and
// the inverse rotation applied to its q and k columns.
#include "fsdp/error.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/nn/layers.h"

namespace fsdp::nn {

namespace {

// The element `offset` of a tensor's buffer, in its dtype.
void* element(const Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype));
}

}  // namespace

Attention::Attention(const TransformerConfig& c, int layer)
    : Module("Attention"),
      heads_(c.heads),
      kv_heads_(c.kv_heads),
      head_dim_(c.head_dim()),
      seq_len_(c.seq_len),
      inv_freq_(rope_inv_freq(c.head_dim(), c.rope_theta, c.rope_scaling)) {
  c.validate();
  const int64_t qkv_rows = (c.heads + 2 * c.kv_heads) * head_dim_;
  const int64_t q_width = c.heads * head_dim_;
  ParamInit wqkv_init = normal_init_fn(transformer_param_seed(c.seed, layer, InitRole::Wqkv),
                                       qkv_rows * c.dim, kTransformerInitStd);
  // The biases start at zero, as Hugging Face's Qwen2 initializes them.
  wqkv_ = &add_child("wqkv", c.attention_bias
                                 ? std::make_unique<Linear>(c.dim, qkv_rows, std::move(wqkv_init),
                                                            zeros_init_fn(qkv_rows))
                                 : std::make_unique<Linear>(c.dim, qkv_rows, std::move(wqkv_init)));
  wo_ = &add_child("wo", std::make_unique<Linear>(
                             q_width, c.dim,
                             normal_init_fn(transformer_param_seed(c.seed, layer, InitRole::Wo),
                                         c.dim * q_width, residual_projection_init_std(layer))));
}

Tensor Attention::forward_impl(RunContext& ctx, const Tensor& x) {
  FSDP_CHECK(x.rows % seq_len_ == 0, "Attention ", fqn(), ": ", x.rows,
             " tokens are not whole sequences of ", seq_len_);
  Device& d = *ctx.device;
  const int64_t tokens = x.rows, batch = tokens / seq_len_;
  const int64_t q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
  Tensor qkv = wqkv_->forward(ctx, x);
  const int64_t ld = qkv.cols;
  d.set_label(op_label("fwd", "rope"));
  d.rope(ctx.compute, qkv.data, ld, ctx.act_dtype, tokens, heads_, head_dim_, seq_len_,
         inv_freq_.data(), false);
  d.rope(ctx.compute, element(qkv, q_width), ld, ctx.act_dtype, tokens, kv_heads_, head_dim_,
         seq_len_, inv_freq_.data(), false);
  Tensor out = empty_tensor(d, ctx.compute, ctx.act_dtype, tokens, q_width, MemTag::Activation);
  Tensor lse = empty_tensor(d, ctx.compute, DType::F32, batch * heads_, seq_len_,
                            MemTag::Activation);
  d.set_label(op_label("fwd", "attention"));
  d.attention_forward(ctx.compute, qkv.data, ld, element(qkv, q_width), ld,
                      element(qkv, q_width + kv_width), ld, ctx.act_dtype, batch, seq_len_,
                      heads_, kv_heads_, head_dim_, out.data, q_width, lse.as<float>());
  saved_qkv_ = std::move(qkv);
  saved_out_ = out;
  saved_lse_ = std::move(lse);
  return wo_->forward(ctx, out);
}

Tensor Attention::forward_cached(RunContext& ctx, const Tensor& x, LayerKvCache& cache,
                                 int64_t position) {
  const int64_t rows = x.rows, q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
  FSDP_CHECK(cache.k.defined() && cache.v.defined() && cache.k.cols == kv_width &&
                 cache.v.cols == kv_width && cache.v.rows == cache.k.rows &&
                 cache.k.dtype == ctx.act_dtype && cache.v.dtype == ctx.act_dtype,
             "Attention ", fqn(), ": the KV cache is not [capacity, ", kv_width, "] of ",
             dtype_name(ctx.act_dtype));
  FSDP_CHECK(rows >= 1 && position >= 0 && position <= cache.capacity() - rows, "Attention ",
             fqn(), ": ", rows, " new tokens at position ", position, " do not fit a cache of ",
             cache.capacity());
  Device& d = *ctx.device;
  Tensor qkv = wqkv_->forward(ctx, x);
  const int64_t ld = qkv.cols;
  d.set_label(op_label("decode", "rope"));
  d.rope_at(ctx.compute, qkv.data, ld, ctx.act_dtype, rows, heads_, head_dim_, position,
            inv_freq_.data());
  d.rope_at(ctx.compute, element(qkv, q_width), ld, ctx.act_dtype, rows, kv_heads_, head_dim_,
            position, inv_freq_.data());
  Tensor out = empty_tensor(d, ctx.compute, ctx.act_dtype, rows, q_width, MemTag::Activation);
  d.set_label(op_label("decode", "attention"));
  d.attention_kv_cache(ctx.compute, qkv.data, ld, element(qkv, q_width), ld,
                       element(qkv, q_width + kv_width), ld, ctx.act_dtype, rows, position,
                       cache.capacity(), heads_, kv_heads_, head_dim_, cache.k.data, cache.v.data,
                       out.data, q_width);
  return wo_->forward(ctx, out);
}

void Attention::drop_own_saved(ActivationCheckpoint what) {
  // Selective keeps all three: RoPE rotates wqkv's output in place, so the rotated q and k
  // are the GEMM's output itself and cost nothing beyond it.
  if (what != ActivationCheckpoint::Full) return;
  saved_qkv_ = saved_out_ = saved_lse_ = Tensor{};
}

Tensor Attention::backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) {
  Device& d = *ctx.device;
  const int64_t tokens = dy.rows, batch = tokens / seq_len_;
  const int64_t q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
  Tensor dout = wo_->backward(ctx, dy);
  const Tensor& qkv = saved_qkv_;
  const int64_t ld = qkv.cols;
  Tensor dqkv = empty_tensor(d, ctx.compute, ctx.act_dtype, tokens, ld, MemTag::Activation);
  d.set_label(op_label("bwd", "attention"));
  d.attention_backward(ctx.compute, qkv.data, ld, element(qkv, q_width), ld,
                       element(qkv, q_width + kv_width), ld, saved_out_.data, q_width, dout.data,
                       q_width, saved_lse_.as<float>(), ctx.act_dtype, batch, seq_len_, heads_,
                       kv_heads_, head_dim_, dqkv.data, element(dqkv, q_width),
                       element(dqkv, q_width + kv_width));
  dout = Tensor{};
  saved_qkv_ = Tensor{};
  saved_out_ = Tensor{};
  saved_lse_ = Tensor{};
  // RoPE is a rotation: its backward rotates the gradient back.
  d.set_label(op_label("bwd", "rope"));
  d.rope(ctx.compute, dqkv.data, ld, ctx.act_dtype, tokens, heads_, head_dim_, seq_len_,
         inv_freq_.data(), true);
  d.rope(ctx.compute, element(dqkv, q_width), ld, ctx.act_dtype, tokens, kv_heads_, head_dim_,
         seq_len_, inv_freq_.data(), true);
  return wqkv_->backward(ctx, dqkv, input_grad);
}

}  // namespace fsdp::nn
