// The transformer ops on the CPU backend (Note [Transformer ops]): each forward against a
// naive double-precision reference, each backward against central finite differences of its
// forward, bf16 against fp32, the strided (fused QKV) layout, and bad arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fused_amax_check.h"
#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"
#include "fsdp/error.h"
#include "fsdp/nn/transformer.h"

namespace fsdp::cpu {
namespace {

using cpu_test::download;
using cpu_test::Floats;
using cpu_test::round_to;
using cpu_test::upload;

using cpu_test::values;

double max_abs(const Floats& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

double max_abs_diff(const Floats& a, const Floats& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// ||a - b|| / ||b||
double rel_error(const Floats& a, const Floats& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / std::max(n, 1e-30));
}

// d/dx of L(x) = sum_i r_i f(x)_i by central differences, one element at a time.
Floats numeric_grad(Floats x, const Floats& r, const std::function<Floats(const Floats&)>& f,
                    float eps = 1e-2f) {
  Floats g(x.size());
  auto loss = [&](const Floats& at) {
    const Floats y = f(at);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(r[i]) * y[i];
    return s;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + eps;
    const double up = loss(x);
    x[i] = keep - eps;
    const double down = loss(x);
    x[i] = keep;
    g[i] = static_cast<float>((up - down) / (2.0 * eps));
  }
  return g;
}

// fp32 central differences with eps 1e-2 on O(1) values: truncation and rounding both stay
// near 1e-4 of the gradient's size.
constexpr double kFiniteDifferenceTol = 2e-3;

class TransformerOps : public cpu_test::DeviceTest {
 protected:
  int32_t* put_ids(const std::vector<int32_t>& ids) {
    void* p = owned.emplace_back(dev->alloc(ids.size() * 4, s, MemTag::Other));
    dev->copy_from_host(s, p, ids.data(), ids.size() * 4);
    return static_cast<int32_t*>(p);
  }
  std::string error_of(const std::function<void()>& call) {
    try {
      call();
      dev->synchronize();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

// ---- shapes and references shared by the attention tests

struct Attn {
  int64_t batch = 2, seq = 6, heads = 4, kv_heads = 2, head_dim = 8;
  int64_t tokens() const { return batch * seq; }
  int64_t qw() const { return heads * head_dim; }
  int64_t kvw() const { return kv_heads * head_dim; }
  int64_t ld() const { return qw() + 2 * kvw(); }  // q, k, v as slices of one fused row
};

// out [tokens, heads*hd] and lse [batch, heads, seq] from packed q [tokens, qw], k, v
// [tokens, kvw], in double, with the full score matrix and a -inf mask.
void naive_attention(const Attn& a, const Floats& q, const Floats& k, const Floats& v,
                     std::vector<double>& out, std::vector<double>& lse) {
  const int64_t hd = a.head_dim, group = a.heads / a.kv_heads;
  out.assign(static_cast<size_t>(a.tokens() * a.qw()), 0.0);
  lse.assign(static_cast<size_t>(a.batch * a.heads * a.seq), 0.0);
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t h = 0; h < a.heads; ++h)
      for (int64_t i = 0; i < a.seq; ++i) {
        std::vector<double> s(static_cast<size_t>(a.seq));
        double m = -INFINITY;
        for (int64_t j = 0; j < a.seq; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < hd; ++c)
            dot += static_cast<double>(q[(b * a.seq + i) * a.qw() + h * hd + c]) *
                   k[(b * a.seq + j) * a.kvw() + (h / group) * hd + c];
          s[j] = j <= i ? dot / std::sqrt(static_cast<double>(hd)) : -INFINITY;
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (double& x : s) z += (x = std::exp(x - m));
        for (int64_t j = 0; j < a.seq; ++j)
          for (int64_t c = 0; c < hd; ++c)
            out[(b * a.seq + i) * a.qw() + h * hd + c] +=
                s[j] / z * v[(b * a.seq + j) * a.kvw() + (h / group) * hd + c];
        lse[(b * a.heads + h) * a.seq + i] = m + std::log(z);
      }
}

// ---- embedding

TEST_F(TransformerOps, EmbeddingGathersRowsAndBackwardSumsRepeatedIds) {
  const int64_t vocab = 7, dim = 5;
  const std::vector<int32_t> ids = {3, 0, 3, 6, 3, 1};
  const int64_t rows = static_cast<int64_t>(ids.size());
  const Floats table = values(vocab * dim, 1.0f, 1), dy = values(rows * dim, 1.0f, 2);
  int32_t* d_ids = put_ids(ids);
  void* out = fresh(rows * dim);
  dev->embedding_forward(s, put(table), DType::F32, d_ids, rows, dim, out);
  const Floats y = get(out, rows * dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < dim; ++c) EXPECT_EQ(y[r * dim + c], table[ids[r] * dim + c]);

  void* dtable = fresh(vocab * dim);  // poisoned: rows never seen must be overwritten with 0
  dev->embedding_backward(s, put(dy), DType::F32, d_ids, rows, dim, vocab, dtable);
  const Floats g = get(dtable, vocab * dim);
  for (int64_t v = 0; v < vocab; ++v)
    for (int64_t c = 0; c < dim; ++c) {
      float expect = 0.0f;  // the same fp32 sum in row order
      for (int64_t r = 0; r < rows; ++r)
        if (ids[r] == v) expect += dy[r * dim + c];
      EXPECT_EQ(g[v * dim + c], expect) << "token " << v << " col " << c;
    }
}

// ---- RMSNorm

TEST_F(TransformerOps, RmsNormForwardMatchesNaive) {
  const int64_t rows = 5, cols = 12;
  const float eps = 1e-5f;
  const Floats x = values(rows * cols, 1.5f, 3), w = values(cols, 1.0f, 4);
  void* y = fresh(rows * cols);
  auto* rstd = static_cast<float*>(fresh(rows));
  dev->rms_norm_forward(s, put(x), put(w), DType::F32, rows, cols, eps, y, rstd, nullptr);
  const Floats got = get(y, rows * cols), got_rstd = get(rstd, rows);
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < cols; ++c) ms += static_cast<double>(x[r * cols + c]) * x[r * cols + c];
    const double inv = 1.0 / std::sqrt(ms / cols + eps);
    EXPECT_NEAR(got_rstd[r], inv, 1e-6 * inv);
    for (int64_t c = 0; c < cols; ++c)
      EXPECT_NEAR(got[r * cols + c], x[r * cols + c] * inv * w[c], 1e-6);
  }
}

TEST_F(TransformerOps, RmsNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 4, cols = 8;
  const float eps = 1e-5f;
  const Floats x = values(rows * cols, 1.5f, 5), w = values(cols, 1.0f, 6);
  const Floats r = values(rows * cols, 1.0f, 7);
  auto forward = [&](const Floats& xv, const Floats& wv) {
    void* y = fresh(rows * cols);
    dev->rms_norm_forward(s, put(xv), put(wv), DType::F32, rows, cols, eps, y,
                          static_cast<float*>(fresh(rows)), nullptr);
    return get(y, rows * cols);
  };
  auto* rstd = static_cast<float*>(fresh(rows));
  void* dx = fresh(rows * cols);
  void* dw = fresh(cols);
  void *dx_in = put(x), *dw_in = put(w);
  dev->rms_norm_forward(s, dx_in, dw_in, DType::F32, rows, cols, eps, fresh(rows * cols), rstd, nullptr);
  dev->rms_norm_backward(s, dx_in, dw_in, rstd, put(r), DType::F32, rows, cols, dx, dw, nullptr);
  const Floats gx = get(dx, rows * cols), gw = get(dw, cols);
  const Floats nx = numeric_grad(x, r, [&](const Floats& v) { return forward(v, w); });
  const Floats nw = numeric_grad(w, r, [&](const Floats& v) { return forward(x, v); });
  EXPECT_LE(rel_error(gx, nx), kFiniteDifferenceTol);
  EXPECT_LE(rel_error(gw, nw), kFiniteDifferenceTol);
}

// ---- RoPE

TEST_F(TransformerOps, RopeIsHuggingFaceRotateHalfOnStridedRows) {
  const int64_t seq = 5, rows = 2 * seq, heads = 3, hd = 8, ld = heads * hd + 4;
  const float theta = 10000.0f;
  const Floats x = values(rows * ld, 1.0f, 8);
  void* d = put(x);
  const std::vector<float> inv_freq = nn::rope_inv_freq(hd, theta, {});
  dev->rope(s, d, ld, DType::F32, rows, heads, hd, seq, inv_freq.data(), false);
  const Floats got = get(d, rows * ld);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        // x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]
        const double angle = static_cast<double>(r % seq) * std::pow(theta, -2.0 * i / hd);
        const double a = x[r * ld + h * hd + i], b = x[r * ld + h * hd + i + hd / 2];
        EXPECT_NEAR(got[r * ld + h * hd + i], a * std::cos(angle) - b * std::sin(angle), 1e-5);
        EXPECT_NEAR(got[r * ld + h * hd + i + hd / 2], b * std::cos(angle) + a * std::sin(angle),
                    1e-5);
      }
    for (int64_t c = heads * hd; c < ld; ++c)  // the stride's gap is not touched
      EXPECT_EQ(got[r * ld + c], x[r * ld + c]);
  }
  // The inverse undoes it (and is its transpose, which makes it the backward).
  dev->rope(s, d, ld, DType::F32, rows, heads, hd, seq, inv_freq.data(), true);
  EXPECT_LE(max_abs_diff(get(d, rows * ld), x), 1e-6);
}

TEST_F(TransformerOps, RopeInverseIsTheBackward) {
  const int64_t seq = 4, rows = 8, heads = 2, hd = 6;
  const Floats x = values(rows * heads * hd, 1.0f, 9), r = values(rows * heads * hd, 1.0f, 10);
  const std::vector<float> inv_freq = nn::rope_inv_freq(hd, 10000.0, {});
  auto forward = [&](const Floats& v) {
    void* d = put(v);
    dev->rope(s, d, heads * hd, DType::F32, rows, heads, hd, seq, inv_freq.data(), false);
    return get(d, rows * heads * hd);
  };
  void* g = put(r);
  dev->rope(s, g, heads * hd, DType::F32, rows, heads, hd, seq, inv_freq.data(), true);
  EXPECT_LE(rel_error(get(g, rows * heads * hd), numeric_grad(x, r, forward)),
            kFiniteDifferenceTol);
}

// ---- attention

TEST_F(TransformerOps, AttentionForwardMatchesNaiveCausalGqa) {
  for (Attn a : {Attn{}, Attn{1, 7, 2, 2, 4}, Attn{3, 4, 4, 1, 6}}) {
    const Floats qkv = values(a.tokens() * a.ld(), 1.5f, 11);
    Floats q, k, v;  // packed copies for the reference
    for (int64_t t = 0; t < a.tokens(); ++t) {
      const auto row = qkv.begin() + t * a.ld();
      q.insert(q.end(), row, row + a.qw());
      k.insert(k.end(), row + a.qw(), row + a.qw() + a.kvw());
      v.insert(v.end(), row + a.qw() + a.kvw(), row + a.ld());
    }
    std::vector<double> ref_out, ref_lse;
    naive_attention(a, q, k, v, ref_out, ref_lse);
    // Strided: q, k, v are column slices of one fused row, as the Attention module passes them.
    char* base = static_cast<char*>(put(qkv));
    void* out = fresh(a.tokens() * a.qw());
    auto* lse = static_cast<float*>(fresh(a.batch * a.heads * a.seq));
    dev->attention_forward(s, base, a.ld(), base + 4 * a.qw(), a.ld(), base + 4 * (a.qw() + a.kvw()),
                           a.ld(), DType::F32, a.batch, a.seq, a.heads, a.kv_heads, a.head_dim,
                           out, a.qw(), lse);
    const Floats got = get(out, a.tokens() * a.qw());
    const Floats got_lse = get(lse, a.batch * a.heads * a.seq);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], ref_out[i], 1e-5) << i;
    for (size_t i = 0; i < got_lse.size(); ++i) ASSERT_NEAR(got_lse[i], ref_lse[i], 1e-5) << i;
    // Packed buffers give the same bits: the strides only move the reads.
    void* out2 = fresh(a.tokens() * a.qw());
    dev->attention_forward(s, put(q), a.qw(), put(k), a.kvw(), put(v), a.kvw(), DType::F32,
                           a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, out2, a.qw(),
                           static_cast<float*>(fresh(a.batch * a.heads * a.seq)));
    EXPECT_EQ(get(out2, a.tokens() * a.qw()), got);
  }
}

TEST_F(TransformerOps, AttentionBackwardMatchesFiniteDifferences) {
  const Attn a;  // 2 sequences of 6, 4 query heads sharing 2 kv heads, head_dim 8
  const Floats q = values(a.tokens() * a.qw(), 1.0f, 12);
  const Floats k = values(a.tokens() * a.kvw(), 1.0f, 13);
  const Floats v = values(a.tokens() * a.kvw(), 1.0f, 14);
  const Floats r = values(a.tokens() * a.qw(), 1.0f, 15);
  auto forward = [&](const Floats& qv, const Floats& kv, const Floats& vv) {
    void* out = fresh(a.tokens() * a.qw());
    dev->attention_forward(s, put(qv), a.qw(), put(kv), a.kvw(), put(vv), a.kvw(), DType::F32,
                           a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, out, a.qw(),
                           static_cast<float*>(fresh(a.batch * a.heads * a.seq)));
    return get(out, a.tokens() * a.qw());
  };
  void *dq_in = put(q), *dk_in = put(k), *dv_in = put(v);
  void* out = fresh(a.tokens() * a.qw());
  auto* lse = static_cast<float*>(fresh(a.batch * a.heads * a.seq));
  dev->attention_forward(s, dq_in, a.qw(), dk_in, a.kvw(), dv_in, a.kvw(), DType::F32, a.batch,
                         a.seq, a.heads, a.kv_heads, a.head_dim, out, a.qw(), lse);
  void *dq = fresh(a.tokens() * a.qw()), *dk = fresh(a.tokens() * a.kvw());
  void* dv = fresh(a.tokens() * a.kvw());
  dev->attention_backward(s, dq_in, a.qw(), dk_in, a.kvw(), dv_in, a.kvw(), out, a.qw(), put(r),
                          a.qw(), lse, DType::F32, a.batch, a.seq, a.heads, a.kv_heads,
                          a.head_dim, dq, dk, dv);
  const Floats nq = numeric_grad(q, r, [&](const Floats& x) { return forward(x, k, v); });
  const Floats nk = numeric_grad(k, r, [&](const Floats& x) { return forward(q, x, v); });
  const Floats nv = numeric_grad(v, r, [&](const Floats& x) { return forward(q, k, x); });
  EXPECT_LE(rel_error(get(dq, a.tokens() * a.qw()), nq), kFiniteDifferenceTol);
  EXPECT_LE(rel_error(get(dk, a.tokens() * a.kvw()), nk), kFiniteDifferenceTol);
  EXPECT_LE(rel_error(get(dv, a.tokens() * a.kvw()), nv), kFiniteDifferenceTol);
}

TEST_F(TransformerOps, AttentionBackwardWritesOnlyItsSlicesOfAFusedGradient) {
  const Attn a;
  const Floats qkv = values(a.tokens() * a.ld(), 1.0f, 16), r = values(a.tokens() * a.qw(), 1.0f, 17);
  char* in = static_cast<char*>(put(qkv));
  void* out = fresh(a.tokens() * a.qw());
  auto* lse = static_cast<float*>(fresh(a.batch * a.heads * a.seq));
  const int64_t ko = 4 * a.qw(), vo = 4 * (a.qw() + a.kvw());
  dev->attention_forward(s, in, a.ld(), in + ko, a.ld(), in + vo, a.ld(), DType::F32, a.batch,
                         a.seq, a.heads, a.kv_heads, a.head_dim, out, a.qw(), lse);
  char* g = static_cast<char*>(fresh(a.tokens() * a.ld()));  // every element must be written
  dev->attention_backward(s, in, a.ld(), in + ko, a.ld(), in + vo, a.ld(), out, a.qw(), put(r),
                          a.qw(), lse, DType::F32, a.batch, a.seq, a.heads, a.kv_heads,
                          a.head_dim, g, g + ko, g + vo);
  const Floats fused = get(g, a.tokens() * a.ld());
  for (float x : fused) ASSERT_FALSE(std::isnan(x));
  // The same numbers as packed gradients.
  Floats q, k, v;
  for (int64_t t = 0; t < a.tokens(); ++t) {
    const auto row = qkv.begin() + t * a.ld();
    q.insert(q.end(), row, row + a.qw());
    k.insert(k.end(), row + a.qw(), row + a.qw() + a.kvw());
    v.insert(v.end(), row + a.qw() + a.kvw(), row + a.ld());
  }
  void *pq = put(q), *pk = put(k), *pv = put(v);
  void *dq = fresh(a.tokens() * a.qw()), *dk = fresh(a.tokens() * a.kvw());
  void* dv = fresh(a.tokens() * a.kvw());
  dev->attention_backward(s, pq, a.qw(), pk, a.kvw(), pv, a.kvw(), out, a.qw(), put(r), a.qw(),
                          lse, DType::F32, a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, dq,
                          dk, dv);
  const Floats gq = get(dq, a.tokens() * a.qw()), gk = get(dk, a.tokens() * a.kvw());
  const Floats gv = get(dv, a.tokens() * a.kvw());
  for (int64_t t = 0; t < a.tokens(); ++t) {
    for (int64_t c = 0; c < a.qw(); ++c) EXPECT_EQ(fused[t * a.ld() + c], gq[t * a.qw() + c]);
    for (int64_t c = 0; c < a.kvw(); ++c) {
      EXPECT_EQ(fused[t * a.ld() + a.qw() + c], gk[t * a.kvw() + c]);
      EXPECT_EQ(fused[t * a.ld() + a.qw() + a.kvw() + c], gv[t * a.kvw() + c]);
    }
  }
}

// ---- SwiGLU

TEST_F(TransformerOps, SwigluMatchesNaiveAndFiniteDifferences) {
  const int64_t rows = 3, ffn = 7;
  const Floats h = values(rows * 2 * ffn, 3.0f, 18), r = values(rows * ffn, 1.0f, 19);
  auto forward = [&](const Floats& hv) {
    void* out = fresh(rows * ffn);
    dev->swiglu_forward(s, put(hv), DType::F32, rows, ffn, out, nullptr);
    return get(out, rows * ffn);
  };
  const Floats y = forward(h);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < ffn; ++c) {
      const double g = h[i * 2 * ffn + c], u = h[i * 2 * ffn + ffn + c];
      EXPECT_NEAR(y[i * ffn + c], g / (1 + std::exp(-g)) * u, 1e-5);
    }
  void* dh = fresh(rows * 2 * ffn);
  dev->swiglu_backward(s, put(h), put(r), DType::F32, rows, ffn, dh, nullptr);
  EXPECT_LE(rel_error(get(dh, rows * 2 * ffn), numeric_grad(h, r, forward)), kFiniteDifferenceTol);
}

// Note [Fused amax]: the amax SwiGLU takes of what it writes is fp8_amax's, NaN included;
// packed rows (ffn a multiple of 8) and not.
TEST_F(TransformerOps, SwigluFusedAmaxIsTheAmaxPassOfItsOutput) {
  for (DType t : {DType::F32, DType::BF16})
    for (int64_t ffn : {13, 64})
      for (int64_t nan_at : {int64_t{-1}, int64_t{5}})
        testing::expect_swiglu_fused_amax(*dev, t, 9, ffn, nan_at,
                                          std::string(dtype_name(t)) + " ffn " + std::to_string(ffn) +
                                              (nan_at >= 0 ? " with a NaN" : ""));
}

// The same for RMSNorm's four kernels: rows of packs (cols a multiple of 8) and not.
TEST_F(TransformerOps, RmsNormFusedAmaxIsTheAmaxPassOfItsOutput) {
  for (DType t : {DType::F32, DType::BF16})
    for (int64_t cols : {13, 64})
      for (int64_t nan_at : {int64_t{-1}, int64_t{30}})
        testing::expect_rms_norm_fused_amax(*dev, t, 9, cols, nan_at,
                                            std::string(dtype_name(t)) + " cols " +
                                                std::to_string(cols) +
                                                (nan_at >= 0 ? " with a NaN" : ""));
}

// ---- bf16 against fp32

// Each op on bf16 buffers against the same op on fp32 buffers holding the same (bf16) values:
// the math is fp32 in both, so the bf16 result is the fp32 result rounded once, and so within
// half a bf16 ulp (2^-9 relative) of it.
TEST_F(TransformerOps, Bf16IsTheFp32ResultRoundedOnce) {
  auto rounded = [](Floats v) {
    for (float& x : v) x = round_to(DType::BF16, x);
    return v;
  };
  auto expect_one_rounding = [](const Floats& bf16, const Floats& f32, const char* what) {
    for (size_t i = 0; i < f32.size(); ++i)
      ASSERT_EQ(bf16[i], round_to(DType::BF16, f32[i])) << what << " element " << i;
    EXPECT_LE(max_abs_diff(bf16, f32), std::ldexp(max_abs(f32), -8)) << what;
  };
  const Attn a;
  const int64_t n_q = a.tokens() * a.qw(), n_kv = a.tokens() * a.kvw();
  const int64_t n_lse = a.batch * a.heads * a.seq;
  const Floats q = rounded(values(n_q, 1.0f, 20)), k = rounded(values(n_kv, 1.0f, 21));
  const Floats v = rounded(values(n_kv, 1.0f, 22)), r = rounded(values(n_q, 1.0f, 23));
  Floats outs[2];
  const std::vector<float> inv_freq = nn::rope_inv_freq(a.head_dim, 10000.0, {});
  for (DType t : {DType::F32, DType::BF16}) {
    void *dq = put(q, t), *dk = put(k, t);
    dev->rope(s, dq, a.qw(), t, a.tokens(), a.heads, a.head_dim, a.seq, inv_freq.data(), false);
    dev->rope(s, dk, a.kvw(), t, a.tokens(), a.kv_heads, a.head_dim, a.seq, inv_freq.data(), false);
    outs[t == DType::BF16] = get(dq, n_q, t);
    if (t == DType::BF16) expect_one_rounding(outs[1], outs[0], "rope");
  }
  // Attention on the same roped inputs (the bf16 ones, exactly representable in both).
  const Floats qr = outs[1];
  Floats fwd[2], lse_of[2], grads[2][3];
  for (DType t : {DType::F32, DType::BF16}) {
    const int i = t == DType::BF16;
    void *dq = put(qr, t), *dk = put(k, t), *dv = put(v, t), *out = fresh(n_q, t);
    auto* lse = static_cast<float*>(fresh(n_lse));
    dev->attention_forward(s, dq, a.qw(), dk, a.kvw(), dv, a.kvw(), t, a.batch, a.seq, a.heads,
                           a.kv_heads, a.head_dim, out, a.qw(), lse);
    fwd[i] = get(out, n_q, t);
    lse_of[i] = get(lse, n_lse);
    // The backward reads `out`: give both the bf16 forward's output.
    void* same_out = put(i ? fwd[1] : rounded(fwd[0]), t);
    void *gq = fresh(n_q, t), *gk = fresh(n_kv, t), *gv = fresh(n_kv, t);
    dev->attention_backward(s, dq, a.qw(), dk, a.kvw(), dv, a.kvw(), same_out, a.qw(), put(r, t),
                            a.qw(), lse, t, a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, gq,
                            gk, gv);
    grads[i][0] = get(gq, n_q, t), grads[i][1] = get(gk, n_kv, t), grads[i][2] = get(gv, n_kv, t);
  }
  expect_one_rounding(fwd[1], fwd[0], "attention out");
  EXPECT_EQ(lse_of[1], lse_of[0]);  // fp32 in both
  expect_one_rounding(grads[1][0], grads[0][0], "attention dq");
  expect_one_rounding(grads[1][1], grads[0][1], "attention dk");
  expect_one_rounding(grads[1][2], grads[0][2], "attention dv");

  // RMSNorm, SwiGLU and the embedding, forward and backward.
  const int64_t rows = 6, cols = 16;
  const Floats x = rounded(values(rows * cols, 2.0f, 24)), w = rounded(values(cols, 1.0f, 25));
  const Floats dy = rounded(values(rows * cols, 1.0f, 26));
  const std::vector<int32_t> ids = {2, 5, 2, 0, 7, 2};
  int32_t* d_ids = put_ids(ids);
  Floats res[2][7];
  for (DType t : {DType::F32, DType::BF16}) {
    const int i = t == DType::BF16;
    void *dx_in = put(x, t), *dw_in = put(w, t), *y = fresh(rows * cols, t);
    auto* rstd = static_cast<float*>(fresh(rows));
    dev->rms_norm_forward(s, dx_in, dw_in, t, rows, cols, 1e-5f, y, rstd, nullptr);
    void *gx = fresh(rows * cols, t), *gw = fresh(cols, t);
    dev->rms_norm_backward(s, dx_in, dw_in, rstd, put(dy, t), t, rows, cols, gx, gw, nullptr);
    res[i][0] = get(y, rows * cols, t), res[i][1] = get(gx, rows * cols, t);
    res[i][2] = get(gw, cols, t);
    void *sw = fresh(rows * cols / 2, t), *dsw = fresh(rows * cols, t);
    dev->swiglu_forward(s, dx_in, t, rows, cols / 2, sw, nullptr);
    dev->swiglu_backward(s, dx_in, put(rounded(values(rows * cols / 2, 1.0f, 27)), t), t, rows,
                         cols / 2, dsw, nullptr);
    res[i][3] = get(sw, rows * cols / 2, t), res[i][4] = get(dsw, rows * cols, t);
    void *emb = fresh(rows * cols, t), *demb = fresh(8 * cols, t);
    dev->embedding_forward(s, put(rounded(values(8 * cols, 1.0f, 28)), t), t, d_ids, rows, cols,
                           emb);
    dev->embedding_backward(s, put(dy, t), t, d_ids, rows, cols, 8, demb);
    res[i][5] = get(emb, rows * cols, t), res[i][6] = get(demb, 8 * cols, t);
  }
  const char* names[] = {"rmsnorm y", "rmsnorm dx", "rmsnorm dw", "swiglu out", "swiglu dh",
                         "embedding out", "embedding dtable"};
  for (int j = 0; j < 7; ++j) expect_one_rounding(res[1][j], res[0][j], names[j]);
}

// bf16 end to end against fp32 end to end on unrounded inputs: what a bf16 model sees. The
// inputs' rounding (2^-9) passes through softmax and the sums; 2e-2 of the output's scale
// covers it with margin.
TEST_F(TransformerOps, Bf16AttentionTracksFp32WithinTwoPercent) {
  const Attn a{2, 8, 4, 2, 16};
  const int64_t n_q = a.tokens() * a.qw(), n_kv = a.tokens() * a.kvw();
  const Floats q = values(n_q, 2.0f, 29), k = values(n_kv, 2.0f, 30), v = values(n_kv, 1.0f, 31);
  const Floats r = values(n_q, 1.0f, 32);
  Floats res[2][4];
  for (DType t : {DType::F32, DType::BF16}) {
    const int i = t == DType::BF16;
    void *dq = put(q, t), *dk = put(k, t), *dv = put(v, t), *out = fresh(n_q, t);
    auto* lse = static_cast<float*>(fresh(a.batch * a.heads * a.seq));
    dev->attention_forward(s, dq, a.qw(), dk, a.kvw(), dv, a.kvw(), t, a.batch, a.seq, a.heads,
                           a.kv_heads, a.head_dim, out, a.qw(), lse);
    void *gq = fresh(n_q, t), *gk = fresh(n_kv, t), *gv = fresh(n_kv, t);
    dev->attention_backward(s, dq, a.qw(), dk, a.kvw(), dv, a.kvw(), out, a.qw(), put(r, t),
                            a.qw(), lse, t, a.batch, a.seq, a.heads, a.kv_heads, a.head_dim, gq,
                            gk, gv);
    res[i][0] = get(out, n_q, t), res[i][1] = get(gq, n_q, t);
    res[i][2] = get(gk, n_kv, t), res[i][3] = get(gv, n_kv, t);
  }
  for (int j = 0; j < 4; ++j)
    EXPECT_LE(max_abs_diff(res[1][j], res[0][j]), 2e-2 * max_abs(res[0][j])) << "output " << j;
}

// ---- bad arguments: one-line errors

TEST_F(TransformerOps, BadShapesAndIdsGiveOneLineErrors) {
  void* buf = fresh(256);
  auto* lse = static_cast<float*>(fresh(64));
  const std::string gqa = error_of([&] {
    dev->attention_forward(s, buf, 24, buf, 8, buf, 8, DType::F32, 1, 4, 3, 2, 8, buf, 24, lse);
  });
  EXPECT_NE(gqa.find("heads (3) must be a multiple of kv_heads (2)"), std::string::npos) << gqa;
  const std::vector<float> freqs = nn::rope_inv_freq(4, 1e4, {});
  const std::string odd =
      error_of([&] { dev->rope(s, buf, 10, DType::F32, 4, 2, 5, 4, freqs.data(), false); });
  EXPECT_NE(odd.find("head_dim must be even"), std::string::npos) << odd;
  const std::string ints = error_of(
      [&] { dev->swiglu_forward(s, buf, DType::I32, 2, 4, buf, nullptr); });
  EXPECT_NE(ints.find("fp32 or bf16"), std::string::npos) << ints;
  for (const std::string& e : {gqa, odd, ints}) EXPECT_EQ(e.find('\n'), std::string::npos) << e;

  // An id outside the table fails on the stream and surfaces at the next synchronize.
  CpuWorld w2{1, {}};
  auto d2 = w2.make_device(0);
  Stream s2 = d2->create_stream("s", StreamPriority::Normal);
  const std::vector<int32_t> ids = {1, 9};
  auto* d_ids = static_cast<int32_t*>(d2->alloc(8, s2, MemTag::Other));
  d2->copy_from_host(s2, d_ids, ids.data(), 8);
  void* dy = d2->alloc(2 * 4 * 4, s2, MemTag::Other);
  void* dt = d2->alloc(4 * 4 * 4, s2, MemTag::Other);
  d2->fill(s2, dy, DType::F32, 8, 1.0f);
  d2->embedding_backward(s2, dy, DType::F32, d_ids, 2, 4, 4, dt);
  try {
    d2->synchronize();
    ADD_FAILURE() << "no error for token id 9 in a vocab of 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 9 of row 1 outside [0, 4)"), std::string::npos)
        << e.what();
  }
  for (void* p : {static_cast<void*>(d_ids), dy, dt}) d2->free(p, s2);
}

}  // namespace
}  // namespace fsdp::cpu
