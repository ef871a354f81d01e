// The CUDA backend's transformer ops (Note [Transformer ops]) against the CPU backend's, on the
// same random inputs, at tiny shapes (odd sizes: the single-element kernel paths) and at real
// ones (dim 2048, seq 2048, 32 heads, 4 kv heads, head_dim 64), in fp32 and bf16. Every
// comparison prints its max abs/rel error and tolerance. Attention in bf16 runs on cuDNN's
// fused engines unless FSDP_ATTENTION=simt; one test checks the two GPU paths against each other.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "fsdp/nn/transformer.h"
#include "../fused_amax_check.h"
#include "transformer_ops_util.h"

namespace fsdp {
namespace {

using transformer_test::Buffers;
using transformer_test::compare_with_cpu;
using transformer_test::elementwise_tolerance;
using transformer_test::expect_match;
using transformer_test::kExact;
using transformer_test::Output;
using transformer_test::Tolerance;
using transformer_test::uniform;

constexpr DType kTypes[] = {DType::F32, DType::BF16};

std::string label(const char* op, DType t, const std::string& shape) {
  return std::string(op) + " " + dtype_name(t) + " " + shape;
}

class CudaTransformerOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  }
};

// Token ids with repeats (so the backward adds several rows into one vocab row) and unused ids.
std::vector<int32_t> token_ids(std::mt19937& rng, int64_t rows, int64_t vocab) {
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab / 2));
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int32_t& x : ids) x = id(rng);
  return ids;
}

TEST_F(CudaTransformerOps, EmbeddingMatchesCpuExactly) {
  struct Shape { int64_t rows, dim, vocab; };
  for (const Shape sh : {Shape{37, 20, 50}, Shape{64, 64, 97}, Shape{2048, 2048, 32000}})
    for (DType t : kTypes) {
      std::mt19937 rng(7);
      const auto table = uniform(rng, static_cast<size_t>(sh.vocab * sh.dim), -1, 1);
      const auto dy = uniform(rng, static_cast<size_t>(sh.rows * sh.dim), -1, 1);
      const auto ids = token_ids(rng, sh.rows, sh.vocab);
      const std::string shape = std::to_string(sh.rows) + "x" + std::to_string(sh.dim) +
                                " vocab " + std::to_string(sh.vocab);
      // Both sum dy rows in row order in fp32: the results are bit-identical.
      compare_with_cpu(label("embedding", t, shape), [&](Buffers& b) {
        Device& d = b.device();
        const int32_t* ids_d = b.upload_ids(ids);
        void* out = b.poisoned(t, sh.rows * sh.dim);
        d.embedding_forward(b.stream(), b.upload(t, table), t, ids_d, sh.rows, sh.dim, out);
        void* dtable = b.poisoned(t, sh.vocab * sh.dim);
        d.embedding_backward(b.stream(), b.upload(t, dy), t, ids_d, sh.rows, sh.dim, sh.vocab,
                             dtable);
        return std::vector<Output>{{"forward", b.read(out, t, sh.rows * sh.dim), kExact},
                                   {"backward", b.read(dtable, t, sh.vocab * sh.dim), kExact}};
      });
    }
}

TEST_F(CudaTransformerOps, RmsNormMatchesCpu) {
  struct Shape { int64_t rows, cols; };
  for (const Shape sh : {Shape{37, 24}, Shape{5, 1001}, Shape{2048, 2048}})
    for (DType t : kTypes) {
      std::mt19937 rng(11);
      const auto x = uniform(rng, static_cast<size_t>(sh.rows * sh.cols), -2, 2);
      const auto w = uniform(rng, static_cast<size_t>(sh.cols), 0.5f, 1.5f);
      const auto dy = uniform(rng, static_cast<size_t>(sh.rows * sh.cols), -1, 1);
      const Tolerance tol = elementwise_tolerance(t);
      const std::string shape = std::to_string(sh.rows) + "x" + std::to_string(sh.cols);
      compare_with_cpu(label("rms_norm", t, shape), [&](Buffers& b) {
        Device& d = b.device();
        void* xd = b.upload(t, x);
        void* wd = b.upload(t, w);
        void* y = b.poisoned(t, sh.rows * sh.cols);
        auto* rstd = static_cast<float*>(b.poisoned(DType::F32, sh.rows));
        d.rms_norm_forward(b.stream(), xd, wd, t, sh.rows, sh.cols, 1e-5f, y, rstd, nullptr);
        void* dx = b.poisoned(t, sh.rows * sh.cols);
        void* dw = b.poisoned(t, sh.cols);
        d.rms_norm_backward(b.stream(), xd, wd, rstd, b.upload(t, dy), t, sh.rows, sh.cols, dx,
                            dw, nullptr);
        return std::vector<Output>{
            {"y", b.read(y, t, sh.rows * sh.cols), tol},
            {"rstd", b.read(rstd, DType::F32, sh.rows), Tolerance{1e-5, 0}},
            {"dx", b.read(dx, t, sh.rows * sh.cols), tol},
            // dw adds 2048 rows in a different order on each backend.
            {"dw", b.read(dw, t, sh.cols), t == DType::F32 ? Tolerance{1e-4, 1e-5} : tol}};
      });
    }
}

TEST_F(CudaTransformerOps, RopeOnStridedQkvMatchesCpu) {
  // RoPE on the q and k column ranges of a fused qkv buffer (row stride ld): v must not change.
  struct Shape { int64_t batch, seq, heads, kv_heads, head_dim; };
  for (const Shape sh : {Shape{2, 13, 3, 1, 10}, Shape{1, 2048, 32, 4, 64}})
    for (DType t : kTypes)
      for (bool inverse : {false, true}) {
        const int64_t rows = sh.batch * sh.seq;
        const int64_t ld = (sh.heads + 2 * sh.kv_heads) * sh.head_dim;
        std::mt19937 rng(13);
        const auto qkv = uniform(rng, static_cast<size_t>(rows * ld), -1, 1);
        const std::string shape = "seq " + std::to_string(sh.seq) + " heads " +
                                  std::to_string(sh.heads) + "+" + std::to_string(sh.kv_heads) +
                                  " hd " + std::to_string(sh.head_dim) +
                                  (inverse ? " inverse" : "");
        const std::vector<float> freqs = nn::rope_inv_freq(sh.head_dim, 10000.0, {});
        compare_with_cpu(label("rope", t, shape), [&](Buffers& b) {
          Device& d = b.device();
          auto* x = static_cast<char*>(b.upload(t, qkv));
          d.rope(b.stream(), x, ld, t, rows, sh.heads, sh.head_dim, sh.seq, freqs.data(), inverse);
          d.rope(b.stream(), x + sh.heads * sh.head_dim * dtype_size(t), ld, t, rows, sh.kv_heads,
                 sh.head_dim, sh.seq, freqs.data(), inverse);
          return std::vector<Output>{{"qkv", b.read(x, t, rows * ld), elementwise_tolerance(t)}};
        });
      }
}

TEST_F(CudaTransformerOps, SwigluMatchesCpu) {
  struct Shape { int64_t rows, ffn; };
  for (const Shape sh : {Shape{37, 13}, Shape{2048, 5632}})
    for (DType t : kTypes) {
      std::mt19937 rng(17);
      const auto h = uniform(rng, static_cast<size_t>(sh.rows * 2 * sh.ffn), -4, 4);
      const auto dout = uniform(rng, static_cast<size_t>(sh.rows * sh.ffn), -1, 1);
      const Tolerance tol = elementwise_tolerance(t);
      const std::string shape = std::to_string(sh.rows) + "x" + std::to_string(sh.ffn);
      compare_with_cpu(label("swiglu", t, shape), [&](Buffers& b) {
        Device& d = b.device();
        void* hd = b.upload(t, h);
        void* out = b.poisoned(t, sh.rows * sh.ffn);
        d.swiglu_forward(b.stream(), hd, t, sh.rows, sh.ffn, out, nullptr);
        void* dh = b.poisoned(t, sh.rows * 2 * sh.ffn);
        d.swiglu_backward(b.stream(), hd, b.upload(t, dout), t, sh.rows, sh.ffn, dh, nullptr);
        return std::vector<Output>{{"out", b.read(out, t, sh.rows * sh.ffn), tol},
                                   {"dh", b.read(dh, t, sh.rows * 2 * sh.ffn), tol}};
      });
    }
}

// Note [Fused amax]: the CUDA kernels' amax of what they write is the CUDA amax pass's, bit for
// bit, NaN included, on the packed path and the single-element one.
TEST_F(CudaTransformerOps, SwigluFusedAmaxIsTheAmaxPassOfItsOutput) {
  auto gpu = cuda::make_device(0);
  for (DType t : kTypes)
    for (int64_t ffn : {13, 5632})
      for (int64_t nan_at : {int64_t{-1}, int64_t{5}})
        testing::expect_swiglu_fused_amax(*gpu, t, ffn == 13 ? 37 : 2048, ffn, nan_at,
                                          label("swiglu amax", t, std::to_string(ffn)) +
                                              (nan_at >= 0 ? " with a NaN" : ""));
}

// RMSNorm's: the register kernels (3072 columns: the 3.0B shape's width) and the general ones
// (13 columns; 12288, wider than the register kernels take).
TEST_F(CudaTransformerOps, RmsNormFusedAmaxIsTheAmaxPassOfItsOutput) {
  auto gpu = cuda::make_device(0);
  for (DType t : kTypes)
    for (int64_t cols : {13, 3072, 12288})
      for (int64_t nan_at : {int64_t{-1}, int64_t{30}})
        testing::expect_rms_norm_fused_amax(*gpu, t, cols == 13 ? 37 : 1024, cols, nan_at,
                                            label("rmsnorm amax", t, std::to_string(cols)) +
                                                (nan_at >= 0 ? " with a NaN" : ""));
}

struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  std::string str() const {
    char text[96];
    std::snprintf(text, sizeof(text), "b%lld s%lld h%lld kv%lld d%lld",
                  static_cast<long long>(batch), static_cast<long long>(seq),
                  static_cast<long long>(heads), static_cast<long long>(kv_heads),
                  static_cast<long long>(head_dim));
    return text;
  }
};

// Attention forward and backward on q, k, v that are column slices of one fused qkv buffer (and
// dq, dk, dv slices of one dqkv buffer), as the transformer's attention module lays them out.
std::vector<Output> run_attention(Buffers& b, const AttentionShape& sh, DType t,
                                  Tolerance out_tol, Tolerance grad_tol) {
  const int64_t rows = sh.batch * sh.seq, hd = sh.head_dim;
  const int64_t ld = (sh.heads + 2 * sh.kv_heads) * hd, ldo = sh.heads * hd;
  std::mt19937 rng(23);
  const auto qkv = uniform(rng, static_cast<size_t>(rows * ld), -2, 2);
  const auto dout = uniform(rng, static_cast<size_t>(rows * ldo), -1, 1);
  Device& d = b.device();
  const size_t es = dtype_size(t);
  auto* x = static_cast<char*>(b.upload(t, qkv));
  char* q = x;
  char* k = x + sh.heads * hd * es;
  char* v = x + (sh.heads + sh.kv_heads) * hd * es;
  void* out = b.poisoned(t, rows * ldo);
  const int64_t lse_n = sh.batch * sh.heads * sh.seq;
  auto* lse = static_cast<float*>(b.poisoned(DType::F32, lse_n));
  d.attention_forward(b.stream(), q, ld, k, ld, v, ld, t, sh.batch, sh.seq, sh.heads,
                      sh.kv_heads, hd, out, ldo, lse);
  auto* dx = static_cast<char*>(b.poisoned(t, rows * ld));
  d.attention_backward(b.stream(), q, ld, k, ld, v, ld, out, ldo, b.upload(t, dout), ldo, lse, t,
                       sh.batch, sh.seq, sh.heads, sh.kv_heads, hd, dx,
                       dx + sh.heads * hd * es, dx + (sh.heads + sh.kv_heads) * hd * es);
  // dq, dk, dv read apart: each has its own magnitude.
  const std::vector<float> grads = b.read(dx, t, rows * ld);
  auto slice = [&](int64_t first_col, int64_t cols) {
    std::vector<float> s;
    for (int64_t r = 0; r < rows; ++r)
      s.insert(s.end(), grads.begin() + r * ld + first_col,
               grads.begin() + r * ld + first_col + cols);
    return s;
  };
  return {{"out", b.read(out, t, rows * ldo), out_tol},
          {"lse", b.read(lse, DType::F32, lse_n), Tolerance{1e-4, 1e-5}},
          {"dq", slice(0, sh.heads * hd), grad_tol},
          {"dk", slice(sh.heads * hd, sh.kv_heads * hd), grad_tol},
          {"dv", slice((sh.heads + sh.kv_heads) * hd, sh.kv_heads * hd), grad_tol}};
}

// Sets FSDP_ATTENTION for the devices made while it lives.
class ScopedAttentionChoice {
 public:
  explicit ScopedAttentionChoice(const char* value) { setenv("FSDP_ATTENTION", value, 1); }
  ~ScopedAttentionChoice() { unsetenv("FSDP_ATTENTION"); }
};

constexpr AttentionShape kRealAttention{1, 2048, 32, 4, 64};

TEST_F(CudaTransformerOps, AttentionFp32MatchesCpu) {
  // fp32 runs the CUDA-core kernel; fp32 sums in another order than the CPU's.
  for (const AttentionShape& sh : {AttentionShape{2, 77, 4, 1, 32}, AttentionShape{2, 128, 4, 2, 64},
                                   AttentionShape{1, 40, 2, 2, 128}, kRealAttention})
    compare_with_cpu(label("attention", DType::F32, sh.str()), [&](Buffers& b) {
      return run_attention(b, sh, DType::F32, Tolerance{1e-4, 1e-5}, Tolerance{1e-3, 1e-4});
    });
}

TEST_F(CudaTransformerOps, AttentionBf16OnCudnnMatchesCpu) {
  // cuDNN multiplies P (and dS) by V (Q, K) in bf16 where the CPU keeps fp32: a few bf16 ulps.
  for (const AttentionShape& sh : {AttentionShape{2, 128, 4, 2, 64}, AttentionShape{1, 77, 4, 1, 32},
                                   AttentionShape{1, 256, 8, 8, 128}, kRealAttention})
    compare_with_cpu(label("attention cudnn", DType::BF16, sh.str()), [&](Buffers& b) {
      return run_attention(b, sh, DType::BF16, Tolerance{3e-2, 1e-2}, Tolerance{5e-2, 2e-2});
    });
}

TEST_F(CudaTransformerOps, AttentionBf16OnCudaCoresMatchesCpu) {
  ScopedAttentionChoice simt("simt");
  // Real sizes are covered by fp32 (same kernel) and by the comparison with cuDNN below.
  for (const AttentionShape& sh : {AttentionShape{2, 77, 4, 1, 32}, AttentionShape{1, 512, 8, 2, 64}})
    compare_with_cpu(label("attention simt", DType::BF16, sh.str()), [&](Buffers& b) {
      return run_attention(b, sh, DType::BF16, Tolerance{1e-2, 1e-3}, Tolerance{2e-2, 2e-3});
    });
}

TEST_F(CudaTransformerOps, AttentionBf16CudnnMatchesCudaCoresAtLlamaSize) {
  const AttentionShape sh{2, 2048, 32, 4, 64};
  std::vector<Output> simt_out, cudnn_out;
  {
    ScopedAttentionChoice simt("simt");
    auto d = cuda::make_device(0);
    Buffers b(*d);
    simt_out = run_attention(b, sh, DType::BF16, {}, {});
  }
  {
    auto d = cuda::make_device(0);
    Buffers b(*d);
    cudnn_out = run_attention(b, sh, DType::BF16, {}, {});
  }
  for (size_t i = 0; i < simt_out.size(); ++i)
    expect_match("attention cudnn vs simt bf16 " + sh.str() + " " + cudnn_out[i].name,
                 cudnn_out[i].values, simt_out[i].values,
                 i == 1 ? Tolerance{1e-4, 1e-5} : Tolerance{5e-2, 2e-2});
}

TEST_F(CudaTransformerOps, CudnnAttentionPlansAreBuiltOncePerShape) {
  auto device = cuda::make_device(0);
  auto& cuda_device = cuda::as_cuda_device(*device);
  ASSERT_TRUE(cuda_device.attention_on_cudnn());
  Buffers b(*device);
  run_attention(b, AttentionShape{1, 128, 4, 2, 64}, DType::BF16, {}, {});
  EXPECT_EQ(cuda_device.cudnn_attention_plans(), 2u);  // one forward, one backward
  run_attention(b, AttentionShape{1, 128, 4, 2, 64}, DType::BF16, {}, {});
  EXPECT_EQ(cuda_device.cudnn_attention_plans(), 2u);  // reused
  run_attention(b, AttentionShape{1, 256, 4, 2, 64}, DType::BF16, {}, {});
  EXPECT_EQ(cuda_device.cudnn_attention_plans(), 4u);  // a new shape
}

TEST_F(CudaTransformerOps, BackwardsAreDeterministic) {
  // Embedding and RMSNorm backward and the CUDA-core attention backward add in a fixed order:
  // two runs agree bit for bit.
  ScopedAttentionChoice simt("simt");
  auto d = cuda::make_device(0);
  auto run = [&] {
    Buffers b(*d);
    std::mt19937 rng(29);
    const int64_t rows = 4096, dim = 512, vocab = 300;
    const DType t = DType::BF16;
    std::vector<Output> outs;
    void* dtable = b.poisoned(t, vocab * dim);
    d->embedding_backward(b.stream(), b.upload(t, uniform(rng, rows * dim, -1, 1)), t,
                          b.upload_ids(token_ids(rng, rows, vocab)), rows, dim, vocab, dtable);
    outs.push_back({"embedding dtable", b.read(dtable, t, vocab * dim), kExact});
    void* x = b.upload(t, uniform(rng, rows * dim, -1, 1));
    void* w = b.upload(t, uniform(rng, dim, 0.5f, 1.5f));
    auto* rstd = static_cast<float*>(b.alloc(rows * 4));
    void* y = b.alloc(rows * dim * 2);
    d->rms_norm_forward(b.stream(), x, w, t, rows, dim, 1e-5f, y, rstd, nullptr);
    void* dx = b.alloc(rows * dim * 2);
    void* dw = b.alloc(dim * 2);
    d->rms_norm_backward(b.stream(), x, w, rstd, b.upload(t, uniform(rng, rows * dim, -1, 1)), t,
                         rows, dim, dx, dw, nullptr);
    outs.push_back({"rms_norm dw", b.read(dw, t, dim), kExact});
    for (Output& o : run_attention(b, AttentionShape{1, 512, 8, 2, 64}, t, kExact, kExact))
      outs.push_back({"attention simt " + o.name, std::move(o.values), kExact});
    return outs;
  };
  const std::vector<Output> first = run(), second = run();
  for (size_t i = 0; i < first.size(); ++i)
    expect_match("determinism " + first[i].name, second[i].values, first[i].values, kExact);
}

TEST_F(CudaTransformerOps, BadArgumentsRaiseOneLineErrors) {
  auto d = cuda::make_device(0);
  Buffers b(*d);
  void* x = b.alloc(1 << 16);
  auto* lse = static_cast<float*>(b.alloc(1 << 12));
  auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string gqa = message_of([&] {
    d->attention_forward(b.stream(), x, 48, x, 48, x, 48, DType::BF16, 1, 8, 3, 2, 8, x, 24, lse);
  });
  EXPECT_NE(gqa.find("multiple of kv_heads"), std::string::npos) << gqa;
  const std::string odd = message_of([&] {
    d->rope(b.stream(), x, 21, DType::F32, 4, 3, 7, 4, nn::rope_inv_freq(6, 1e4, {}).data(), false);
  });
  EXPECT_NE(odd.find("must be even"), std::string::npos) << odd;
  const std::string cudnn_dim = message_of([&] {
    d->attention_forward(b.stream(), x, 80, x, 80, x, 80, DType::BF16, 1, 8, 4, 4, 20, x, 80, lse);
  });
  EXPECT_NE(cudnn_dim.find("FSDP_ATTENTION=simt"), std::string::npos) << cudnn_dim;
  for (const std::string& m : {gqa, odd, cudnn_dim}) EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  setenv("FSDP_ATTENTION", "flash", 1);
  const std::string env = message_of([] { cuda::make_device(0); });
  unsetenv("FSDP_ATTENTION");
  EXPECT_NE(env.find("FSDP_ATTENTION must be cudnn or simt"), std::string::npos) << env;
}

}  // namespace
}  // namespace fsdp
