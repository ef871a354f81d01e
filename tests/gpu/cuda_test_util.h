// Shared by the CUDA backend tests (test_cuda_backend.cpp, test_cuda_kernels.cpp): the
// CudaBackendTest fixture, CudaTwoStreamTest for the graph tests, and host-side comparison helpers. Everything here has external
// linkage (inline, in a named namespace) so that every TEST_F(CudaBackendTest, ...) in either
// file uses one and the same fixture class, as GoogleTest requires within a test suite.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace fsdp::cuda_test {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr DType kTypes[] = {DType::F32, DType::BF16};

inline float round_to(DType t, float v) {
  return t == DType::F32 ? v : bf16_to_float(float_to_bf16(v));
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device = cuda::make_device(0);
    s = device->create_stream("main", StreamPriority::Normal);
  }
  void TearDown() override {
    for (void* p : owned) device->free(p, s);
    device->synchronize();
    EXPECT_EQ(device->memory_stats().current_bytes, 0) << "a test leaked device memory";
  }

  // Magnitudes in [lo, hi], random sign.
  std::vector<float> random(size_t n, float lo = 0.1f, float hi = 1.0f, bool signed_values = true) {
    std::uniform_real_distribution<float> mag(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = (signed_values && (rng() & 1)) ? -mag(rng) : mag(rng);
    return v;
  }
  std::vector<float> rounded(DType t, std::vector<float> v) {
    for (float& x : v) x = round_to(t, x);
    return v;
  }
  void* buffer(DType t, int64_t n, MemTag tag = MemTag::Other) {
    void* p = device->alloc(static_cast<size_t>(n) * dtype_size(t), s, tag);
    owned.push_back(p);
    return p;
  }
  void* upload(DType t, const std::vector<float>& values) {
    void* p = buffer(t, static_cast<int64_t>(values.size()));
    std::vector<uint8_t> bytes(values.size() * dtype_size(t));
    for (size_t i = 0; i < values.size(); ++i) store_from_float(bytes.data(), t, i, values[i]);
    device->copy_from_host(s, p, bytes.data(), bytes.size());
    return p;
  }
  void* poisoned(DType t, int64_t n) {
    void* p = buffer(t, n);
    device->fill(s, p, t, n, kNaN);
    return p;
  }
  std::vector<float> read(const void* p, DType t, int64_t n) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(t));
    device->copy_to_host(s, bytes.data(), p, bytes.size());
    device->synchronize_stream(s);
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = load_as_float(bytes.data(), t, i);
    return v;
  }

  std::unique_ptr<Device> device;
  Stream s;
  std::mt19937 rng{20240611u};
  std::vector<void*> owned;
};

// A device with a compute stream and a side stream, for the CUDA-graph tests
// (test_cuda_graph.cpp, test_cuda_graph_timeline.cpp); skipped without a GPU.
class CudaTwoStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
    device = cuda::make_device(0);
    s = device->create_stream("compute", StreamPriority::Normal);
    side = device->create_stream("side", StreamPriority::Normal);
  }
  std::unique_ptr<Device> device;
  Stream s, side;
};

// |got - want| <= rel |want| + abs for every element; reports the first few misses.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel,
                         double abs, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(double{got[i]} - want[i]);
    if (!(diff <= rel * std::fabs(want[i]) + abs) && ++misses <= 5)
      ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << " want " << want[i];
  }
  EXPECT_EQ(misses, 0) << what;
}
inline std::vector<double> to_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

}  // namespace fsdp::cuda_test
