// The CUDA backend's fused kernels against the CPU reference: the one-read cross-entropy (every
// kernel variant: 16-byte packs or single elements, the row kept in shared memory or read twice,
// dlogits over the logits, loss only) and RMSNorm with its residual add, forward and backward
// (the register kernels at every packs-per-thread, the general kernels for odd and very wide
// rows, outputs over their inputs); and GEMMs whose plan was autotuned (Note [GEMM autotune]).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "transformer_ops_util.h"

namespace fsdp {
namespace {

using transformer_test::Buffers;
using transformer_test::compare_with_cpu;
using transformer_test::elementwise_tolerance;
using transformer_test::Output;
using transformer_test::Tolerance;
using transformer_test::uniform;

constexpr DType kTypes[] = {DType::F32, DType::BF16};

class CudaFusedOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  }
};

std::string label(const char* op, DType t, int64_t rows, int64_t cols, const char* variant = "") {
  return std::string(op) + " " + dtype_name(t) + " " + std::to_string(rows) + "x" +
         std::to_string(cols) + variant;
}

TEST_F(CudaFusedOps, CrossEntropyMatchesCpu) {
  struct Shape { int64_t rows, classes; };
  // 1001: single elements; 32000: packs, cached in bf16, read twice in fp32 (128 kB rows);
  // 50000: packs, read twice in both.
  for (const Shape sh : {Shape{37, 1001}, Shape{64, 32000}, Shape{16, 50000}})
    for (DType t : kTypes)
      for (int mode = 0; mode < 3; ++mode) {  // 0: dlogits apart, 1: over the logits, 2: loss only
        std::mt19937 rng(13);
        const auto logits = uniform(rng, static_cast<size_t>(sh.rows * sh.classes), -8, 8);
        std::vector<int32_t> labels(static_cast<size_t>(sh.rows));
        for (auto& l : labels) l = static_cast<int32_t>(rng() % sh.classes);
        const char* variant = mode == 0 ? "" : mode == 1 ? " in place" : " loss only";
        compare_with_cpu(label("cross_entropy", t, sh.rows, sh.classes, variant), [&](Buffers& b) {
          const int64_t n = sh.rows * sh.classes;
          void* x = b.upload(t, logits);
          void* dx = mode == 0 ? b.poisoned(t, n) : mode == 1 ? x : nullptr;
          auto* loss = static_cast<float*>(b.poisoned(DType::F32, 1));
          b.device().cross_entropy_loss(b.stream(), x, t, b.upload_ids(labels), sh.rows,
                                        sh.classes, loss, dx);
          std::vector<Output> out{{"loss", b.read(loss, DType::F32, 1), Tolerance{1e-5, 0}}};
          if (dx) out.push_back({"dlogits", b.read(dx, t, n), elementwise_tolerance(t)});
          return out;
        });
      }
}

TEST_F(CudaFusedOps, AddRmsNormForwardAndBackwardMatchCpu) {
  struct Shape { int64_t rows, cols; };
  // 24 and 1001: general kernels (single elements); 2048, 4096, 6144: register kernels with
  // 1, 2 and 4 packs per thread; 12288: general kernel with packs (too wide for registers).
  for (const Shape sh : {Shape{37, 24}, Shape{5, 1001}, Shape{2048, 2048}, Shape{64, 4096},
                         Shape{16, 6144}, Shape{8, 12288}})
    for (DType t : kTypes)
      for (bool in_place : {false, true}) {  // h over x, dx over dresidual
        std::mt19937 rng(17);
        const int64_t n = sh.rows * sh.cols;
        const auto x = uniform(rng, static_cast<size_t>(n), -2, 2);
        const auto res = uniform(rng, static_cast<size_t>(n), -1, 1);
        const auto w = uniform(rng, static_cast<size_t>(sh.cols), 0.5f, 1.5f);
        const auto dy = uniform(rng, static_cast<size_t>(n), -1, 1);
        const auto dres = uniform(rng, static_cast<size_t>(n), -1, 1);
        const Tolerance tol = elementwise_tolerance(t);
        const char* variant = in_place ? " in place" : "";
        compare_with_cpu(label("add_rms_norm", t, sh.rows, sh.cols, variant), [&](Buffers& b) {
          Device& d = b.device();
          void* xd = b.upload(t, x);
          void* wd = b.upload(t, w);
          void* h = in_place ? xd : b.poisoned(t, n);
          void* y = b.poisoned(t, n);
          auto* rstd = static_cast<float*>(b.poisoned(DType::F32, sh.rows));
          d.add_rms_norm_forward(b.stream(), xd, b.upload(t, res), wd, t, sh.rows, sh.cols, 1e-5f,
                                 h, y, rstd, nullptr);
          void* dresd = b.upload(t, dres);
          void* dx = in_place ? dresd : b.poisoned(t, n);
          void* dw = b.poisoned(t, sh.cols);
          d.rms_norm_backward_add(b.stream(), h, wd, rstd, b.upload(t, dy), dresd, t, sh.rows,
                                  sh.cols, dx, dw, nullptr);
          return std::vector<Output>{
              // h is one rounding of the same fp32 sum on both: exact.
              {"h", b.read(h, t, n), Tolerance{0, 0}},
              {"y", b.read(y, t, n), tol},
              {"rstd", b.read(rstd, DType::F32, sh.rows), Tolerance{1e-5, 0}},
              {"dx", b.read(dx, t, n), tol},
              // dw adds the rows in a different order on each backend.
              {"dw", b.read(dw, t, sh.cols), t == DType::F32 ? Tolerance{1e-4, 1e-5} : tol}};
        });
      }
}

// Note [GEMM autotune]: with FSDP_GEMM_AUTOTUNE=1 a new plan times several algorithms on the
// call's operands; the call's own C must still be alpha A B + beta C of the C it had (the timing
// runs write a scratch output), for every transpose, also when C is read (beta != 0).
TEST_F(CudaFusedOps, AutotunedGemmGivesTheSameResultAndLeavesCAlone) {
  setenv("FSDP_GEMM_AUTOTUNE", "1", 1);
  std::unique_ptr<Device> gpu;
  try {
    gpu = cuda::make_device(0);
  } catch (...) {
    unsetenv("FSDP_GEMM_AUTOTUNE");
    throw;
  }
  unsetenv("FSDP_GEMM_AUTOTUNE");
  Buffers b(*gpu);
  const int64_t m = 192, n = 320, k = 512;  // big enough for several candidate algorithms
  const DType t = DType::BF16;
  std::mt19937 rng(23);
  auto exact = [&](size_t count) {  // bf16-exact values, so the host reference sees the same
    auto v = uniform(rng, count, -1, 1);
    for (float& x : v) x = bf16_to_float(float_to_bf16(x));
    return v;
  };
  for (int trans = 0; trans < 4; ++trans) {
    const bool ta = trans & 1, tb = trans & 2;
    const auto a = exact(static_cast<size_t>(m * k)), bm = exact(static_cast<size_t>(k * n));
    const auto c0 = uniform(rng, static_cast<size_t>(m * n), -1, 1);
    void* dc = b.upload(DType::F32, c0);
    gpu->gemm(b.stream(), ta, tb, m, n, k, 1.5f, b.upload(t, a), b.upload(t, bm), t, 0.5f, dc,
              DType::F32);
    const auto got = b.read(dc, DType::F32, m * n);
    std::vector<float> want(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < k; ++p)
          sum += double{ta ? a[p * m + i] : a[i * k + p]} * (tb ? bm[j * k + p] : bm[p * n + j]);
        want[i * n + j] = static_cast<float>(1.5 * sum + 0.5 * c0[i * n + j]);
      }
    transformer_test::expect_match("autotuned gemm ta=" + std::to_string(ta) +
                                       " tb=" + std::to_string(tb),
                                   got, want, Tolerance{1e-4, 1e-5});
  }
}

}  // namespace
}  // namespace fsdp
