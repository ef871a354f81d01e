// The transformer's ops on the CPU backend (Note [Transformer ops]): the reference the CUDA
// kernels are tested against, so each is the plainest loop that states the contract. Inputs
// are read as fp32, all arithmetic and sums are fp32 in a fixed order (deterministic), and each
// output element is rounded to its dtype once. Attention materializes one query row's scores
// at a time.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_attention_rows.h"
#include "backend/cpu/cpu_device.h"
#include "backend/cpu/cpu_dtype_io.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/op_checks.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

namespace {

using backend::check_activation_dtype;
using backend::check_ptr;

struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  int64_t ldq, ldk, ldv, ldo;
};

void check_attention(const AttentionShape& a, const char* op) {
  FSDP_CHECK(a.batch >= 1 && a.seq >= 1 && a.heads >= 1 && a.kv_heads >= 1 && a.head_dim >= 1, op,
             ": batch ", a.batch, ", seq ", a.seq, ", heads ", a.heads, ", kv_heads ", a.kv_heads,
             ", head_dim ", a.head_dim, " must all be positive");
  FSDP_CHECK(a.heads % a.kv_heads == 0, op, ": heads (", a.heads,
             ") must be a multiple of kv_heads (", a.kv_heads, ")");
  FSDP_CHECK(a.ldq >= a.heads * a.head_dim && a.ldo >= a.heads * a.head_dim &&
                 a.ldk >= a.kv_heads * a.head_dim && a.ldv >= a.kv_heads * a.head_dim,
             op, ": a row stride is smaller than its row (ldq ", a.ldq, ", ldk ", a.ldk, ", ldv ",
             a.ldv, ", ldo ", a.ldo, ")");
}

// ---- kernels

template <typename Io>
void embedding_forward_kernel(const void* table, const int32_t* ids, int64_t rows, int64_t dim,
                              void* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = static_cast<int64_t>(ids[r]) * dim;
    for (int64_t c = 0; c < dim; ++c) Io::store(out, r * dim + c, Io::load(table, base + c));
  }
}

template <typename Io>
void embedding_backward_kernel(const void* dy, const int32_t* ids, int64_t rows, int64_t dim,
                               int64_t vocab, void* dtable) {
  std::vector<float> acc(static_cast<size_t>(vocab * dim), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    FSDP_CHECK(ids[r] >= 0 && ids[r] < vocab, "embedding_backward: token id ", ids[r], " of row ",
               r, " outside [0, ", vocab, ")");
    float* dst = acc.data() + static_cast<int64_t>(ids[r]) * dim;
    for (int64_t c = 0; c < dim; ++c) dst[c] += Io::load(dy, r * dim + c);
  }
  for (int64_t i = 0; i < vocab * dim; ++i) Io::store(dtable, i, acc[static_cast<size_t>(i)]);
}

// With a residual: h = x + residual is stored (rounded) first and normalized as read back, so
// the result is exactly that of add() followed by the plain norm.
template <typename Io>
void rms_norm_forward_kernel(const void* x, const void* residual, const void* w, int64_t rows,
                             int64_t cols, float eps, void* h, void* y, float* rstd) {
  if (residual) {
    for (int64_t i = 0; i < rows * cols; ++i)
      Io::store(h, i, Io::load(x, i) + Io::load(residual, i));
    x = h;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float sum_sq = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = Io::load(x, r * cols + c);
      sum_sq += v * v;
    }
    const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(cols) + eps);
    rstd[r] = inv;
    for (int64_t c = 0; c < cols; ++c)
      Io::store(y, r * cols + c, Io::load(x, r * cols + c) * inv * Io::load(w, c));
  }
}

// With xh = x * rstd and g = dy * w: dx = rstd * (g - xh * mean_c(g * xh)) (+ dresidual, in
// fp32 before the one rounding), dw = sum_r dy * xh.
template <typename Io>
void rms_norm_backward_kernel(const void* x, const void* w, const float* rstd, const void* dy,
                              const void* dresidual, int64_t rows, int64_t cols, void* dx,
                              void* dw) {
  std::vector<float> dw_acc(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = rstd[r];
    float mean_gx = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const float xh = Io::load(x, r * cols + c) * inv;
      const float d = Io::load(dy, r * cols + c);
      mean_gx += d * Io::load(w, c) * xh;
      dw_acc[static_cast<size_t>(c)] += d * xh;
    }
    mean_gx /= static_cast<float>(cols);
    for (int64_t c = 0; c < cols; ++c) {
      const float xh = Io::load(x, r * cols + c) * inv;
      const float g = Io::load(dy, r * cols + c) * Io::load(w, c);
      const float dres = dresidual ? Io::load(dresidual, r * cols + c) : 0.0f;
      Io::store(dx, r * cols + c, inv * (g - xh * mean_gx) + dres);
    }
  }
  for (int64_t c = 0; c < cols; ++c) Io::store(dw, c, dw_acc[static_cast<size_t>(c)]);
}

template <typename Io>
void attention_forward_kernel(const AttentionShape& a, const void* q, const void* k,
                              const void* v, void* out, float* lse) {
  const int64_t group = a.heads / a.kv_heads, hd = a.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> kh, vh, qrow(static_cast<size_t>(hd)), acc, p;
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t t0 = b * a.seq;
    for (int64_t h = 0; h < a.heads; ++h) {
      const int64_t kvh = h / group;
      if (h % group == 0) {
        gather_head<Io>(k, a.ldk, t0, kvh * hd, a.seq, hd, kh);
        gather_head<Io>(v, a.ldv, t0, kvh * hd, a.seq, hd, vh);
      }
      for (int64_t i = 0; i < a.seq; ++i) {
        for (int64_t c = 0; c < hd; ++c)
          qrow[static_cast<size_t>(c)] = Io::load(q, (t0 + i) * a.ldq + h * hd + c);
        lse[(b * a.heads + h) * a.seq + i] = attend_row<Io>(
            qrow.data(), kh.data(), vh.data(), i + 1, hd, scale, p, acc, out,
            (t0 + i) * a.ldo + h * hd);
      }
    }
  }
}

// With P = softmax(S) rebuilt from lse and D_i = dout_i . out_i:
// dS_ij = P_ij (dout_i . v_j - D_i); dq_i = scale sum_j dS_ij k_j; dk_j = scale sum_i dS_ij q_i;
// dv_j = sum_i P_ij dout_i. dk and dv also sum over the query heads of their group.
template <typename Io>
void attention_backward_kernel(const AttentionShape& a, const void* q, const void* k,
                               const void* v, const void* out, const void* dout, int64_t lddo,
                               const float* lse, void* dq, void* dk, void* dv) {
  const int64_t group = a.heads / a.kv_heads, hd = a.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> kh, vh, dkh, dvh;
  std::vector<float> qrow(static_cast<size_t>(hd)), dorow(static_cast<size_t>(hd));
  std::vector<float> dqrow(static_cast<size_t>(hd));
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t t0 = b * a.seq;
    for (int64_t kvh = 0; kvh < a.kv_heads; ++kvh) {
      gather_head<Io>(k, a.ldk, t0, kvh * hd, a.seq, hd, kh);
      gather_head<Io>(v, a.ldv, t0, kvh * hd, a.seq, hd, vh);
      dkh.assign(static_cast<size_t>(a.seq * hd), 0.0f);
      dvh.assign(static_cast<size_t>(a.seq * hd), 0.0f);
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t i = 0; i < a.seq; ++i) {
          const int64_t t = t0 + i;
          float d_i = 0.0f;
          for (int64_t c = 0; c < hd; ++c) {
            qrow[static_cast<size_t>(c)] = Io::load(q, t * a.ldq + h * hd + c);
            dorow[static_cast<size_t>(c)] = Io::load(dout, t * lddo + h * hd + c);
            d_i += dorow[static_cast<size_t>(c)] * Io::load(out, t * a.ldo + h * hd + c);
          }
          const float lse_i = lse[(b * a.heads + h) * a.seq + i];
          std::fill(dqrow.begin(), dqrow.end(), 0.0f);
          for (int64_t j = 0; j <= i; ++j) {
            const float* kj = kh.data() + j * hd;
            const float* vj = vh.data() + j * hd;
            const float p = std::exp(scale * dot(qrow.data(), kj, hd) - lse_i);
            const float ds = p * (dot(dorow.data(), vj, hd) - d_i) * scale;
            float* dkj = dkh.data() + j * hd;
            float* dvj = dvh.data() + j * hd;
            for (int64_t c = 0; c < hd; ++c) {
              dqrow[static_cast<size_t>(c)] += ds * kj[c];
              dkj[c] += ds * qrow[static_cast<size_t>(c)];
              dvj[c] += p * dorow[static_cast<size_t>(c)];
            }
          }
          for (int64_t c = 0; c < hd; ++c)
            Io::store(dq, t * a.ldq + h * hd + c, dqrow[static_cast<size_t>(c)]);
        }
      }
      for (int64_t j = 0; j < a.seq; ++j)
        for (int64_t c = 0; c < hd; ++c) {
          Io::store(dk, (t0 + j) * a.ldk + kvh * hd + c, dkh[static_cast<size_t>(j * hd + c)]);
          Io::store(dv, (t0 + j) * a.ldv + kvh * hd + c, dvh[static_cast<size_t>(j * hd + c)]);
        }
    }
  }
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

template <typename Io>
void swiglu_forward_kernel(const void* h, int64_t rows, int64_t ffn, void* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ffn; ++c) {
      const float g = Io::load(h, r * 2 * ffn + c), u = Io::load(h, r * 2 * ffn + ffn + c);
      Io::store(out, r * ffn + c, g * sigmoid(g) * u);
    }
}

// d gate = dout * up * sig(g) * (1 + g * (1 - sig(g))), d up = dout * silu(g).
template <typename Io>
void swiglu_backward_kernel(const void* h, const void* dout, int64_t rows, int64_t ffn, void* dh) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ffn; ++c) {
      const float g = Io::load(h, r * 2 * ffn + c), u = Io::load(h, r * 2 * ffn + ffn + c);
      const float d = Io::load(dout, r * ffn + c), sg = sigmoid(g);
      Io::store(dh, r * 2 * ffn + c, d * u * sg * (1.0f + g * (1.0f - sg)));
      Io::store(dh, r * 2 * ffn + ffn + c, d * g * sg);
    }
}

}  // namespace

void CpuDevice::embedding_forward(Stream s, const void* table, DType t, const int32_t* ids,
                                  int64_t rows, int64_t dim, void* out) {
  const char* op = "embedding_forward";
  check_activation_dtype(t, op);
  FSDP_CHECK(rows >= 0 && dim >= 1, op, ": rows ", rows, ", dim ", dim);
  check_ptr(table, "table", op), check_ptr(ids, "ids", op), check_ptr(out, "out", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) {
      embedding_forward_kernel<decltype(io)>(table, ids, rows, dim, out);
    });
  });
}

void CpuDevice::embedding_backward(Stream s, const void* dy, DType t, const int32_t* ids,
                                   int64_t rows, int64_t dim, int64_t vocab, void* dtable) {
  const char* op = "embedding_backward";
  check_activation_dtype(t, op);
  FSDP_CHECK(rows >= 0 && dim >= 1 && vocab >= 1, op, ": rows ", rows, ", dim ", dim, ", vocab ",
             vocab);
  check_ptr(dy, "dy", op), check_ptr(ids, "ids", op), check_ptr(dtable, "dtable", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) {
      embedding_backward_kernel<decltype(io)>(dy, ids, rows, dim, vocab, dtable);
    });
  });
}

void CpuDevice::rms_norm_forward(Stream s, const void* x, const void* w, DType t, int64_t rows,
                                 int64_t cols, float eps, void* y, float* rstd, float* amax) {
  const char* op = "rms_norm_forward";
  check_activation_dtype(t, op);
  FSDP_CHECK(rows >= 0 && cols >= 1 && eps >= 0, op, ": rows ", rows, ", cols ", cols, ", eps ",
             eps);
  check_ptr(x, "x", op), check_ptr(w, "w", op), check_ptr(y, "y", op);
  check_ptr(rstd, "rstd", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) {
      rms_norm_forward_kernel<decltype(io)>(x, nullptr, w, rows, cols, eps, nullptr, y, rstd);
    });
    if (amax) *amax = kernels::abs_max(y, t, rows * cols);  // Note [Fused amax]
  });
}

void CpuDevice::rms_norm_backward(Stream s, const void* x, const void* w, const float* rstd,
                                  const void* dy, DType t, int64_t rows, int64_t cols, void* dx,
                                  void* dw, float* amax) {
  const char* op = "rms_norm_backward";
  check_activation_dtype(t, op);
  FSDP_CHECK(rows >= 0 && cols >= 1, op, ": rows ", rows, ", cols ", cols);
  check_ptr(x, "x", op), check_ptr(w, "w", op), check_ptr(rstd, "rstd", op);
  check_ptr(dy, "dy", op), check_ptr(dx, "dx", op), check_ptr(dw, "dw", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) {
      rms_norm_backward_kernel<decltype(io)>(x, w, rstd, dy, nullptr, rows, cols, dx, dw);
    });
    if (amax) *amax = kernels::abs_max(dx, t, rows * cols);
  });
}

void CpuDevice::add_rms_norm_forward(Stream s, const void* x, const void* residual,
                                     const void* w, DType t, int64_t rows, int64_t cols, float eps,
                                     void* h, void* y, float* rstd, float* amax) {
  const char* op = "add_rms_norm_forward";
  check_activation_dtype(t, op);
  FSDP_CHECK(rows >= 0 && cols >= 1 && eps >= 0, op, ": rows ", rows, ", cols ", cols, ", eps ",
             eps);
  check_ptr(x, "x", op), check_ptr(residual, "residual", op), check_ptr(w, "w", op);
  check_ptr(h, "h", op), check_ptr(y, "y", op), check_ptr(rstd, "rstd", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) {
      rms_norm_forward_kernel<decltype(io)>(x, residual, w, rows, cols, eps, h, y, rstd);
    });
    if (amax) *amax = kernels::abs_max(y, t, rows * cols);
  });
}

void CpuDevice::rms_norm_backward_add(Stream s, const void* x, const void* w, const float* rstd,
                                      const void* dy, const void* dresidual, DType t,
                                      int64_t rows, int64_t cols, void* dx, void* dw,
                                      float* amax) {
  const char* op = "rms_norm_backward_add";
  check_activation_dtype(t, op);
  FSDP_CHECK(rows >= 0 && cols >= 1, op, ": rows ", rows, ", cols ", cols);
  check_ptr(x, "x", op), check_ptr(w, "w", op), check_ptr(rstd, "rstd", op);
  check_ptr(dy, "dy", op), check_ptr(dresidual, "dresidual", op);
  check_ptr(dx, "dx", op), check_ptr(dw, "dw", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) {
      rms_norm_backward_kernel<decltype(io)>(x, w, rstd, dy, dresidual, rows, cols, dx, dw);
    });
    if (amax) *amax = kernels::abs_max(dx, t, rows * cols);
  });
}

void CpuDevice::rope(Stream s, void* x, int64_t ld, DType t, int64_t rows, int64_t heads,
                     int64_t head_dim, int64_t seq_len, const float* inv_freq, bool inverse) {
  const char* op = "rope";
  check_activation_dtype(t, op);
  check_ptr(x, "x", op);
  FSDP_CHECK(inv_freq != nullptr, op, ": no inverse frequencies");
  FSDP_CHECK(head_dim >= 2 && head_dim % 2 == 0, op, ": head_dim must be even, got ", head_dim);
  FSDP_CHECK(rows >= 0 && heads >= 1 && seq_len >= 1, op, ": rows ", rows, ", heads ", heads,
             ", seq_len ", seq_len);
  FSDP_CHECK(ld >= heads * head_dim, op, ": row stride ", ld, " is smaller than a row of ",
             heads * head_dim);
  // Copied now: the caller's array need not outlive the call (Device::rope).
  std::vector<float> freqs(inv_freq, inv_freq + head_dim / 2);
  enqueue(s, OpKind::Kernel, [=, freqs = std::move(freqs)] {
    with_io(t, [&](auto io) {
      rope_kernel<decltype(io)>(x, ld, rows, heads, head_dim, seq_len, 0, freqs, inverse);
    });
  });
}

void CpuDevice::attention_forward(Stream s, const void* q, int64_t ldq, const void* k,
                                  int64_t ldk, const void* v, int64_t ldv, DType t, int64_t batch,
                                  int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim,
                                  void* out, int64_t ldo, float* lse) {
  const char* op = "attention_forward";
  check_activation_dtype(t, op);
  const AttentionShape a{batch, seq, heads, kv_heads, head_dim, ldq, ldk, ldv, ldo};
  check_attention(a, op);
  check_ptr(q, "q", op), check_ptr(k, "k", op), check_ptr(v, "v", op);
  check_ptr(out, "out", op), check_ptr(lse, "lse", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) { attention_forward_kernel<decltype(io)>(a, q, k, v, out, lse); });
  });
}

void CpuDevice::attention_backward(Stream s, const void* q, int64_t ldq, const void* k,
                                   int64_t ldk, const void* v, int64_t ldv, const void* out,
                                   int64_t ldo, const void* dout, int64_t lddo, const float* lse,
                                   DType t, int64_t batch, int64_t seq, int64_t heads,
                                   int64_t kv_heads, int64_t head_dim, void* dq, void* dk,
                                   void* dv) {
  const char* op = "attention_backward";
  check_activation_dtype(t, op);
  const AttentionShape a{batch, seq, heads, kv_heads, head_dim, ldq, ldk, ldv, ldo};
  check_attention(a, op);
  FSDP_CHECK(lddo >= heads * head_dim, op, ": dout row stride ", lddo, " is smaller than a row of ",
             heads * head_dim);
  check_ptr(q, "q", op), check_ptr(k, "k", op), check_ptr(v, "v", op);
  check_ptr(out, "out", op), check_ptr(dout, "dout", op), check_ptr(lse, "lse", op);
  check_ptr(dq, "dq", op), check_ptr(dk, "dk", op), check_ptr(dv, "dv", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) {
      attention_backward_kernel<decltype(io)>(a, q, k, v, out, dout, lddo, lse, dq, dk, dv);
    });
  });
}

// Note [Fused amax]: the output's amax in the same op, over the stored values: the same
// max as fp8_amax's pass over them.
void CpuDevice::swiglu_forward(Stream s, const void* h, DType t, int64_t rows, int64_t ffn,
                               void* out, float* amax) {
  const char* op = "swiglu_forward";
  check_activation_dtype(t, op);
  FSDP_CHECK(rows >= 0 && ffn >= 1, op, ": rows ", rows, ", ffn ", ffn);
  check_ptr(h, "h", op), check_ptr(out, "out", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) { swiglu_forward_kernel<decltype(io)>(h, rows, ffn, out); });
    if (amax) *amax = kernels::abs_max(out, t, rows * ffn);
  });
}

void CpuDevice::swiglu_backward(Stream s, const void* h, const void* dout, DType t, int64_t rows,
                                int64_t ffn, void* dh, float* amax) {
  const char* op = "swiglu_backward";
  check_activation_dtype(t, op);
  FSDP_CHECK(rows >= 0 && ffn >= 1, op, ": rows ", rows, ", ffn ", ffn);
  check_ptr(h, "h", op), check_ptr(dout, "dout", op), check_ptr(dh, "dh", op);
  enqueue(s, OpKind::Kernel, [=] {
    with_io(t, [&](auto io) { swiglu_backward_kernel<decltype(io)>(h, dout, rows, ffn, dh); });
    if (amax) *amax = kernels::abs_max(dh, t, rows * 2 * ffn);
  });
}

}  // namespace fsdp::cpu
