// Note [Fused amax]: on any backend, SwiGLU's forward and backward take the amax of what they
// write, bit for bit what fp8_amax's pass over their outputs gives, NaN included. Shared by the
// CPU test (tests/test_transformer_ops.cpp) and the CUDA one (tests/gpu/).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fsdp/device.h"
#include "fsdp/dtype.h"

namespace fsdp::testing {

inline uint32_t bits_of_float(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// h [rows, 2 ffn] and dout [rows, ffn] from a seed, in dtype t; a NaN at h[nan_at] when >= 0.
inline void expect_swiglu_fused_amax(Device& d, DType t, int64_t rows, int64_t ffn,
                                     int64_t nan_at, const std::string& what) {
  const Stream s = d.create_stream("fused amax", StreamPriority::Normal);
  std::mt19937 rng(static_cast<uint32_t>(rows * 131 + ffn));
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  auto upload = [&](int64_t n, int64_t nan) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(t));
    for (int64_t i = 0; i < n; ++i)
      store_from_float(bytes.data(), t, static_cast<size_t>(i), i == nan ? std::nanf("") : dist(rng));
    void* p = d.alloc(bytes.size(), s, MemTag::Other);
    d.copy_from_host(s, p, bytes.data(), bytes.size());
    return p;
  };
  void* h = upload(rows * 2 * ffn, nan_at);
  void* dout = upload(rows * ffn, -1);
  void* out = d.alloc(static_cast<size_t>(rows * ffn) * dtype_size(t), s, MemTag::Other);
  void* dh = d.alloc(static_cast<size_t>(rows * 2 * ffn) * dtype_size(t), s, MemTag::Other);
  auto* amax = static_cast<float*>(d.alloc(4 * sizeof(float), s, MemTag::Other));
  d.fill(s, amax, DType::F32, 4, -1.0f);  // a stale value the ops must overwrite
  d.swiglu_forward(s, h, t, rows, ffn, out, amax);
  d.fp8_amax(s, out, t, rows, ffn, Device::Fp8Axis::Tensor, amax + 1);
  d.swiglu_backward(s, h, dout, t, rows, ffn, dh, amax + 2);
  d.fp8_amax(s, dh, t, rows, 2 * ffn, Device::Fp8Axis::Tensor, amax + 3);
  float got[4];
  d.copy_to_host(s, got, amax, sizeof got);
  d.synchronize_stream(s);
  EXPECT_EQ(bits_of_float(got[0]), bits_of_float(got[1]))
      << what << ": forward fused " << got[0] << ", pass " << got[1];
  EXPECT_EQ(bits_of_float(got[2]), bits_of_float(got[3]))
      << what << ": backward fused " << got[2] << ", pass " << got[3];
  if (nan_at >= 0) EXPECT_TRUE(std::isnan(got[0]) && std::isnan(got[2])) << what;
  else EXPECT_GT(got[0], 0.0f) << what;
  for (void* p : {h, dout, out, dh, static_cast<void*>(amax)}) d.free(p, s);
  d.synchronize_stream(s);
}

}  // namespace fsdp::testing
