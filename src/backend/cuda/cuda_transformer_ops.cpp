// CudaDevice: the transformer's ops (Note [Transformer ops]). Each validates its arguments on
// the host, as the CPU backend does, so a bad call is a one-line Error rather than a device
// fault, then enqueues the kernels of kernels_transformer.cu / attention_simt.cu or cuDNN's
// fused attention (Note [cuDNN attention]).
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/op_checks.h"

namespace fsdp::cuda {

namespace {

using backend::check_activation_dtype;
using backend::check_ptr;

kernels::AttentionArgs attention_args(const char* op, int64_t batch, int64_t seq, int64_t heads,
                                      int64_t kv_heads, int64_t head_dim, int64_t ldq,
                                      int64_t ldk, int64_t ldv, int64_t ldo, int64_t lddo) {
  FSDP_CHECK(batch >= 1 && seq >= 1 && heads >= 1 && kv_heads >= 1 && head_dim >= 1, op,
             ": batch ", batch, ", seq ", seq, ", heads ", heads, ", kv_heads ", kv_heads,
             ", head_dim ", head_dim, " must all be positive");
  FSDP_CHECK(heads % kv_heads == 0, op, ": heads (", heads, ") must be a multiple of kv_heads (",
             kv_heads, ")");
  FSDP_CHECK(ldq >= heads * head_dim && ldo >= heads * head_dim && lddo >= heads * head_dim &&
                 ldk >= kv_heads * head_dim && ldv >= kv_heads * head_dim,
             op, ": a row stride is smaller than its row (ldq ", ldq, ", ldk ", ldk, ", ldv ", ldv,
             ", ldo ", ldo, ", lddo ", lddo, ")");
  kernels::AttentionArgs a;
  a.batch = batch, a.seq = seq, a.heads = heads, a.kv_heads = kv_heads, a.head_dim = head_dim;
  a.ldq = ldq, a.ldk = ldk, a.ldv = ldv, a.ldo = ldo, a.lddo = lddo;
  return a;
}

}  // namespace

size_t CudaDevice::cudnn_attention_plans() const {
  return cudnn_attention_ ? cudnn_attention_->cached_plans() : 0;
}

void CudaDevice::embedding_forward(Stream s, const void* table, DType t, const int32_t* ids,
                                   int64_t rows, int64_t dim, void* out) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "embedding_forward";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && dim >= 1, name, ": rows ", rows, ", dim ", dim);
  check_ptr(table, "table", name), check_ptr(ids, "ids", name), check_ptr(out, "out", name);
  kernels::embedding_forward(op.stream(), table, t, ids, rows, dim, out);
}

void CudaDevice::embedding_backward(Stream s, const void* dy, DType t, const int32_t* ids,
                                    int64_t rows, int64_t dim, int64_t vocab, void* dtable) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "embedding_backward";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && dim >= 1 && vocab >= 1, name, ": rows ", rows, ", dim ", dim,
             ", vocab ", vocab);
  check_ptr(dy, "dy", name), check_ptr(ids, "ids", name), check_ptr(dtable, "dtable", name);
  kernels::embedding_backward(op.stream(), pool_, dy, t, ids, rows, dim, vocab, dtable);
}

void CudaDevice::rms_norm_forward(Stream s, const void* x, const void* w, DType t, int64_t rows,
                                  int64_t cols, float eps, void* y, float* rstd, float* amax) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "rms_norm_forward";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && cols >= 1, name, ": rows ", rows, ", cols ", cols);
  FSDP_CHECK(eps >= 0.0f, name, ": eps ", eps, " is negative");
  check_ptr(x, "x", name), check_ptr(w, "w", name), check_ptr(y, "y", name);
  check_ptr(rstd, "rstd", name);
  kernels::rms_norm_forward(op.stream(), x, nullptr, w, t, rows, cols, eps, nullptr, y, rstd,
                            amax);
}

void CudaDevice::rms_norm_backward(Stream s, const void* x, const void* w, const float* rstd,
                                   const void* dy, DType t, int64_t rows, int64_t cols, void* dx,
                                   void* dw, float* amax) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "rms_norm_backward";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && cols >= 1, name, ": rows ", rows, ", cols ", cols);
  check_ptr(x, "x", name), check_ptr(w, "w", name), check_ptr(rstd, "rstd", name);
  check_ptr(dy, "dy", name), check_ptr(dx, "dx", name), check_ptr(dw, "dw", name);
  kernels::rms_norm_backward(op.stream(), pool_, x, w, rstd, dy, nullptr, t, rows, cols, dx,
                             dw, amax);
}

void CudaDevice::add_rms_norm_forward(Stream s, const void* x, const void* residual,
                                      const void* w, DType t, int64_t rows, int64_t cols,
                                      float eps, void* h, void* y, float* rstd, float* amax) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "add_rms_norm_forward";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && cols >= 1, name, ": rows ", rows, ", cols ", cols);
  FSDP_CHECK(eps >= 0.0f, name, ": eps ", eps, " is negative");
  check_ptr(x, "x", name), check_ptr(residual, "residual", name), check_ptr(w, "w", name);
  check_ptr(h, "h", name), check_ptr(y, "y", name), check_ptr(rstd, "rstd", name);
  kernels::rms_norm_forward(op.stream(), x, residual, w, t, rows, cols, eps, h, y, rstd, amax);
}

void CudaDevice::rms_norm_backward_add(Stream s, const void* x, const void* w, const float* rstd,
                                       const void* dy, const void* dresidual, DType t,
                                       int64_t rows, int64_t cols, void* dx, void* dw,
                                       float* amax) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "rms_norm_backward_add";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && cols >= 1, name, ": rows ", rows, ", cols ", cols);
  check_ptr(x, "x", name), check_ptr(w, "w", name), check_ptr(rstd, "rstd", name);
  check_ptr(dy, "dy", name), check_ptr(dresidual, "dresidual", name);
  check_ptr(dx, "dx", name), check_ptr(dw, "dw", name);
  kernels::rms_norm_backward(op.stream(), pool_, x, w, rstd, dy, dresidual, t, rows, cols, dx,
                             dw, amax);
}

namespace {

// RoPE's head shape checked, and its frequencies as a kernel argument: they travel with the
// launch, so the caller's host array need not outlive the call, and a captured graph replays
// them. Shared by rope (training) and rope_at (a KV cache's positions).
kernels::RopeFreqs rope_freqs(const char* name, int64_t ld, int64_t heads, int64_t head_dim,
                              const float* inv_freq) {
  FSDP_CHECK(head_dim >= 2 && head_dim % 2 == 0 && head_dim / 2 <= kernels::kRopeMaxHalf, name,
             ": head_dim ", head_dim, " must be even and at most ", 2 * kernels::kRopeMaxHalf);
  FSDP_CHECK(ld >= heads * head_dim, name, ": row stride ", ld, " is smaller than ", heads,
             " heads x ", head_dim);
  FSDP_CHECK(inv_freq != nullptr, name, ": no inverse frequencies");
  kernels::RopeFreqs freqs{};
  for (int64_t i = 0; i < head_dim / 2; ++i) freqs.inv_freq[i] = inv_freq[i];
  return freqs;
}

}  // namespace

void CudaDevice::rope(Stream s, void* x, int64_t ld, DType t, int64_t rows, int64_t heads,
                      int64_t head_dim, int64_t seq_len, const float* inv_freq, bool inverse) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "rope";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && heads >= 1 && seq_len >= 1, name, ": rows ", rows, ", heads ", heads,
             ", seq_len ", seq_len);
  check_ptr(x, "x", name);
  const kernels::RopeFreqs freqs = rope_freqs(name, ld, heads, head_dim, inv_freq);
  kernels::rope(op.stream(), x, ld, t, rows, heads, head_dim, seq_len, 0, freqs, inverse);
}

void CudaDevice::attention_forward(Stream s, const void* q, int64_t ldq, const void* k,
                                   int64_t ldk, const void* v, int64_t ldv, DType t,
                                   int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                   int64_t head_dim, void* out, int64_t ldo, float* lse) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "attention_forward";
  check_activation_dtype(t, name);
  const kernels::AttentionArgs a =
      attention_args(name, batch, seq, heads, kv_heads, head_dim, ldq, ldk, ldv, ldo, ldo);
  check_ptr(q, "q", name), check_ptr(k, "k", name), check_ptr(v, "v", name);
  check_ptr(out, "out", name), check_ptr(lse, "lse", name);
  if (t == DType::BF16 && !attention_simt_) {
    if (!cudnn_attention_) cudnn_attention_ = std::make_unique<CudnnAttention>(pool_);
    cudnn_attention_->forward(op.stream(), a, q, k, v, out, lse);
    return;
  }
  kernels::attention_forward_simt(op.stream(), a, t, q, k, v, out, lse);
}

void CudaDevice::attention_backward(Stream s, const void* q, int64_t ldq, const void* k,
                                    int64_t ldk, const void* v, int64_t ldv, const void* out,
                                    int64_t ldo, const void* dout, int64_t lddo, const float* lse,
                                    DType t, int64_t batch, int64_t seq, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, void* dq, void* dk,
                                    void* dv) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "attention_backward";
  check_activation_dtype(t, name);
  const kernels::AttentionArgs a =
      attention_args(name, batch, seq, heads, kv_heads, head_dim, ldq, ldk, ldv, ldo, lddo);
  check_ptr(q, "q", name), check_ptr(k, "k", name), check_ptr(v, "v", name);
  check_ptr(out, "out", name), check_ptr(dout, "dout", name), check_ptr(lse, "lse", name);
  check_ptr(dq, "dq", name), check_ptr(dk, "dk", name), check_ptr(dv, "dv", name);
  if (t == DType::BF16 && !attention_simt_) {
    if (!cudnn_attention_) cudnn_attention_ = std::make_unique<CudnnAttention>(pool_);
    cudnn_attention_->backward(op.stream(), a, q, k, v, out, dout, lse, dq, dk, dv);
    return;
  }
  kernels::attention_backward_simt(op.stream(), pool_, a, t, q, k, v, out, dout, lse, dq, dk, dv);
}

// Note [KV cache]
void CudaDevice::rope_at(Stream s, void* x, int64_t ld, DType t, int64_t rows, int64_t heads,
                         int64_t head_dim, int64_t first_position, const float* inv_freq) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "rope_at";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && heads >= 1 && first_position >= 0, name, ": rows ", rows, ", heads ",
             heads, ", first_position ", first_position);
  check_ptr(x, "x", name);
  const kernels::RopeFreqs freqs = rope_freqs(name, ld, heads, head_dim, inv_freq);
  const int64_t seq_len = rows > 0 ? rows : 1;  // r % seq_len == r
  kernels::rope(op.stream(), x, ld, t, rows, heads, head_dim, seq_len, first_position, freqs,
                false);
}

void CudaDevice::attention_kv_cache(Stream s, const void* q, int64_t ldq, const void* k,
                                    int64_t ldk, const void* v, int64_t ldv, DType t,
                                    int64_t rows, int64_t position, int64_t capacity,
                                    int64_t heads, int64_t kv_heads, int64_t head_dim,
                                    void* k_cache, void* v_cache, void* out, int64_t ldo) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "attention_kv_cache";
  check_activation_dtype(t, name);
  backend::check_kv_cache_attention(rows, position, capacity, heads, kv_heads, head_dim, ldq, ldk,
                                    ldv, ldo, name);
  FSDP_CHECK(head_dim <= kernels::kKvCacheMaxHeadDim, name, ": head_dim ", head_dim,
             " is above the ", kernels::kKvCacheMaxHeadDim, " this kernel takes");
  check_ptr(q, "q", name), check_ptr(k, "k", name), check_ptr(v, "v", name);
  check_ptr(k_cache, "k_cache", name), check_ptr(v_cache, "v_cache", name);
  check_ptr(out, "out", name);
  kernels::attention_kv_cache(op.stream(), t, q, ldq, k, ldk, v, ldv, rows, position, heads,
                              kv_heads, head_dim, k_cache, v_cache, out, ldo);
}

void CudaDevice::swiglu_forward(Stream s, const void* h, DType t, int64_t rows, int64_t ffn,
                                void* out, float* amax) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "swiglu_forward";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && ffn >= 1, name, ": rows ", rows, ", ffn ", ffn);
  check_ptr(h, "h", name), check_ptr(out, "out", name);
  kernels::swiglu_forward(op.stream(), h, t, rows, ffn, out, amax);
}

void CudaDevice::swiglu_backward(Stream s, const void* h, const void* dout, DType t, int64_t rows,
                                 int64_t ffn, void* dh, float* amax) {
  OpScope op(*this, s, OpKind::Kernel);
  const char* name = "swiglu_backward";
  check_activation_dtype(t, name);
  FSDP_CHECK(rows >= 0 && ffn >= 1, name, ": rows ", rows, ", ffn ", ffn);
  check_ptr(h, "h", name), check_ptr(dout, "dout", name), check_ptr(dh, "dh", name);
  kernels::swiglu_backward(op.stream(), h, dout, t, rows, ffn, dh, amax);
}

}  // namespace fsdp::cuda
