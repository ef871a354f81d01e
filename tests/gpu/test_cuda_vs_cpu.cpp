// The CUDA backend against the CPU backend, op by op, on the same random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "fsdp/synthetic.h"

namespace fsdp {
namespace {

// Runs gemm_relu on `device` for random A [m,k], B [n,k] (C = relu(A B^T)), returns C as fp32.
std::vector<float> gemm_relu_on(Device& d, int64_t m, int64_t n, int64_t k, DType t) {
  const Stream s = d.create_stream("compute", StreamPriority::Normal);
  void* a = d.alloc(static_cast<size_t>(m * k) * dtype_size(t), s, MemTag::Other);
  void* b = d.alloc(static_cast<size_t>(n * k) * dtype_size(t), s, MemTag::Other);
  void* c = d.alloc(static_cast<size_t>(m * n) * dtype_size(t), s, MemTag::Other);
  void* c32 = d.alloc(static_cast<size_t>(m * n) * 4, s, MemTag::Other);
  d.synthetic_batch(s, a, t, m, k, 11, 0, 0, 1.0f);  // fresh random values, never zeros
  d.synthetic_batch(s, b, t, n, k, 12, 0, 0, 1.0f);
  d.fill(s, c, t, m * n, std::nanf(""));  // poisoned: every element must be written
  d.gemm_relu(s, false, true, m, n, k, a, b, t, c, t);
  d.cast(s, c32, DType::F32, c, t, m * n);
  std::vector<float> out(static_cast<size_t>(m * n));
  d.copy_to_host(s, out.data(), c32, out.size() * 4);
  d.synchronize();
  for (void* p : {a, b, c, c32}) d.free(p, s);
  d.synchronize();
  return out;
}

TEST(CudaVsCpu, GemmReluEpilogueMatchesTheCpuBackend) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  for (DType t : {DType::F32, DType::BF16}) {
    const int64_t m = 67, n = 129, k = 96;
    cpu::CpuWorld world(1, {});
    auto cpu_device = world.make_device(0);
    auto cuda_device = cuda::make_device(0);
    const std::vector<float> want = gemm_relu_on(*cpu_device, m, n, k, t);
    const std::vector<float> got = gemm_relu_on(*cuda_device, m, n, k, t);
    double diff = 0, norm = 0;
    int negatives = 0, zeros = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << "element " << i << " not written";
      negatives += got[i] < 0;
      zeros += want[i] == 0;
      diff += (got[i] - want[i]) * (got[i] - want[i]);
      norm += want[i] * want[i];
    }
    EXPECT_EQ(negatives, 0);
    EXPECT_GT(zeros, static_cast<int>(want.size() / 4));  // the ReLU really clipped
    EXPECT_LE(std::sqrt(diff / norm), t == DType::F32 ? 1e-5 : 1e-2) << dtype_name(t);
  }
}

}  // namespace
}  // namespace fsdp
