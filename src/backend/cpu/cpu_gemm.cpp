// GEMM for the CPU backend: OpenBLAS sgemm when available (FSDP_HAVE_CBLAS), a plain loop
// otherwise. bf16 operands are widened to fp32 temporaries, so accumulation is always fp32
// and the result is rounded to c_t once.
#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/cpu/cpu_dtype_io.h"
#include "backend/cpu/cpu_kernels.h"
#include "fsdp/error.h"

#if defined(FSDP_HAVE_CBLAS)
#include <cblas.h>
#endif

namespace fsdp::cpu::kernels {

namespace {

// fp32 view of a buffer: the buffer itself when it is fp32, else a widened copy.
const float* as_f32(const void* src, DType t, int64_t n, std::vector<float>& storage) {
  if (t == DType::F32) return static_cast<const float*>(src);
  storage.resize(static_cast<size_t>(n));
  with_io(t, [&](auto in) {
    for (int64_t i = 0; i < n; ++i) storage[static_cast<size_t>(i)] = in.load(src, i);
  });
  return storage.data();
}

// C = alpha * op(A) op(B) + beta * C, all fp32, row-major, C is [m, n] with ld n.
void sgemm_rowmajor(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, const float* b, float beta, float* c) {
#if defined(FSDP_HAVE_CBLAS)
  FSDP_CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX, "gemm dims ", m, "x", n, "x", k,
             " exceed the BLAS int range");
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(trans_a ? m : k), b,
              static_cast<int>(trans_b ? k : n), beta, c, static_cast<int>(n));
#else
  // i-k-j order keeps the inner loop contiguous in B and C when B is not transposed.
  std::vector<float> acc(static_cast<size_t>(n));
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t p = 0; p < k; ++p) {
      const float av = trans_a ? a[p * m + i] : a[i * k + p];
      for (int64_t j = 0; j < n; ++j) acc[j] += av * (trans_b ? b[j * k + p] : b[p * n + j]);
    }
    for (int64_t j = 0; j < n; ++j)
      c[i * n + j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * c[i * n + j]);
  }
#endif
}

}  // namespace

void configure_blas_once() {
#if defined(FSDP_HAVE_CBLAS)
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
#endif
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
          const void* b, DType ab_t, float beta, void* c, DType c_t) {
  if (m == 0 || n == 0) return;
  const int64_t c_numel = m * n;
  if (k == 0) {
    // No products: C = beta * C. beta == 0 must not read C (it may hold NaN poison).
    with_io(c_t, [&](auto io) {
      for (int64_t i = 0; i < c_numel; ++i)
        io.store(c, i, beta == 0.0f ? 0.0f : beta * io.load(c, i));
    });
    return;
  }
  std::vector<float> a_storage, b_storage;
  const float* a32 = as_f32(a, ab_t, m * k, a_storage);
  const float* b32 = as_f32(b, ab_t, k * n, b_storage);
  if (c_t == DType::F32) {
    sgemm_rowmajor(trans_a, trans_b, m, n, k, alpha, a32, b32, beta, static_cast<float*>(c));
    return;
  }
  // bf16 output: accumulate into an fp32 C, round once at the end.
  std::vector<float> c32(static_cast<size_t>(c_numel), 0.0f);
  if (beta != 0.0f) as_f32(c, c_t, c_numel, c32);
  sgemm_rowmajor(trans_a, trans_b, m, n, k, alpha, a32, b32, beta, c32.data());
  with_io(c_t, [&](auto out) {
    for (int64_t i = 0; i < c_numel; ++i) out.store(c, i, c32[static_cast<size_t>(i)]);
  });
}

}  // namespace fsdp::cpu::kernels
