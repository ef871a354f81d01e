// Device::gemm_relu on the CPU backend is relu(gemm): the fused path the mlp blocks take.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace fsdp {
namespace {

TEST(CpuBackendGemmRelu, EqualsGemmThenRelu) {
  cpu::CpuWorld world(1, {});
  auto d = world.make_device(0);
  const Stream s = d->create_stream("compute", StreamPriority::Normal);
  const int64_t m = 9, n = 13, k = 7;
  std::vector<float> a(m * k), b(n * k);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 37) % 11) - 5.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 17) % 7) - 3.0f;
  auto buf = [&](size_t n_floats) { return d->alloc(n_floats * 4, s, MemTag::Other); };
  void *da = buf(a.size()), *db = buf(b.size()), *fused = buf(m * n), *plain = buf(m * n);
  d->copy_from_host(s, da, a.data(), a.size() * 4);
  d->copy_from_host(s, db, b.data(), b.size() * 4);
  d->gemm_relu(s, false, true, m, n, k, da, db, DType::F32, fused, DType::F32);
  d->gemm(s, false, true, m, n, k, 1.0f, da, db, DType::F32, 0.0f, plain, DType::F32);
  std::vector<float> got(m * n), raw(m * n);
  d->copy_to_host(s, got.data(), fused, got.size() * 4);
  d->copy_to_host(s, raw.data(), plain, raw.size() * 4);
  d->synchronize();
  int clipped = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], raw[i] > 0 ? raw[i] : 0.0f) << i;
    clipped += raw[i] < 0;
  }
  EXPECT_GT(clipped, 0);  // the inputs make some outputs negative
  for (void* p : {da, db, fused, plain}) d->free(p, s);
  d->synchronize();
}

}  // namespace
}  // namespace fsdp
