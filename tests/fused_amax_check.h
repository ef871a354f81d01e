// Note [Fused amax]: on any backend, SwiGLU's and RMSNorm's forward and backward take the amax
// of what they write, bit for bit what fp8_amax's pass over their outputs gives, NaN included.
// Shared by the CPU test (tests/test_transformer_ops.cpp) and the CUDA one (tests/gpu/).
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

// Device buffers of random values in dtype t (a NaN at nan_at when >= 0) and the comparison of
// each fused amax with the amax pass over the same output; frees everything at the end.
class FusedAmaxCheck {
 public:
  FusedAmaxCheck(Device& d, DType t, uint32_t seed)
      : d_(d), t_(t), s_(d.create_stream("fused amax", StreamPriority::Normal)), rng_(seed) {}
  ~FusedAmaxCheck() {
    for (void* p : buffers_) d_.free(p, s_);
    d_.synchronize_stream(s_);
  }
  Stream stream() const { return s_; }
  void* random(int64_t n, int64_t nan_at = -1) {
    std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(t_));
    for (int64_t i = 0; i < n; ++i)
      store_from_float(bytes.data(), t_, static_cast<size_t>(i),
                       i == nan_at ? std::nanf("") : dist(rng_));
    void* p = empty(n, t_);
    d_.copy_from_host(s_, p, bytes.data(), bytes.size());
    return p;
  }
  void* empty(int64_t n, DType t) {
    buffers_.push_back(d_.alloc(static_cast<size_t>(n) * dtype_size(t), s_, MemTag::Other));
    return buffers_.back();
  }
  // A fresh amax slot holding a stale value (-1) that the op must overwrite.
  float* amax() {
    auto* a = static_cast<float*>(empty(1, DType::F32));
    d_.fill(s_, a, DType::F32, 1, -1.0f);
    return a;
  }
  // The fused amax of out [rows, cols] against the pass over it; expect_nan: NaN, else > 0.
  void expect_pass(const float* fused, const void* out, int64_t rows, int64_t cols,
                   bool expect_nan, const std::string& what) {
    float* pass = amax();
    d_.fp8_amax(s_, out, t_, rows, cols, Device::Fp8Axis::Tensor, pass);
    float got[2];
    d_.copy_to_host(s_, &got[0], fused, sizeof(float));
    d_.copy_to_host(s_, &got[1], pass, sizeof(float));
    d_.synchronize_stream(s_);
    EXPECT_EQ(bits_of_float(got[0]), bits_of_float(got[1]))
        << what << ": fused " << got[0] << ", pass " << got[1];
    if (expect_nan) EXPECT_TRUE(std::isnan(got[0])) << what;
    else EXPECT_GT(got[0], 0.0f) << what;
  }

 private:
  Device& d_;
  DType t_;
  Stream s_;
  std::mt19937 rng_;
  std::vector<void*> buffers_;
};

// h [rows, 2 ffn] and dout [rows, ffn] from a seed, in dtype t; a NaN at h[nan_at] when >= 0.
inline void expect_swiglu_fused_amax(Device& d, DType t, int64_t rows, int64_t ffn,
                                     int64_t nan_at, const std::string& what) {
  FusedAmaxCheck c(d, t, static_cast<uint32_t>(rows * 131 + ffn));
  const Stream s = c.stream();
  void* h = c.random(rows * 2 * ffn, nan_at);
  void* dout = c.random(rows * ffn);
  void* out = c.empty(rows * ffn, t);
  void* dh = c.empty(rows * 2 * ffn, t);
  float* forward = c.amax();
  float* backward = c.amax();
  d.swiglu_forward(s, h, t, rows, ffn, out, forward);
  d.swiglu_backward(s, h, dout, t, rows, ffn, dh, backward);
  c.expect_pass(forward, out, rows, ffn, nan_at >= 0, what + ", forward");
  c.expect_pass(backward, dh, rows, 2 * ffn, nan_at >= 0, what + ", backward");
}

// The plain and the residual-fused RMSNorm, forward (amax of y) and backward (of dx), on
// x [rows, cols] with a NaN at x[nan_at] when >= 0 (it reaches every output of its row, and
// through the backward's mean, dx's row).
inline void expect_rms_norm_fused_amax(Device& d, DType t, int64_t rows, int64_t cols,
                                       int64_t nan_at, const std::string& what) {
  FusedAmaxCheck c(d, t, static_cast<uint32_t>(rows * 977 + cols));
  const Stream s = c.stream();
  const int64_t n = rows * cols;
  void* x = c.random(n, nan_at);
  void* residual = c.random(n);
  void* w = c.random(cols);
  void* dy = c.random(n);
  void* dresidual = c.random(n);
  auto* rstd = static_cast<float*>(c.empty(rows, DType::F32));
  void* y = c.empty(n, t);
  void* h = c.empty(n, t);
  void* dx = c.empty(n, t);
  void* dw = c.empty(cols, t);
  const bool nan = nan_at >= 0;
  float* a = c.amax();
  d.rms_norm_forward(s, x, w, t, rows, cols, 1e-5f, y, rstd, a);
  c.expect_pass(a, y, rows, cols, nan, what + ", rms_norm_forward");
  a = c.amax();
  d.rms_norm_backward(s, x, w, rstd, dy, t, rows, cols, dx, dw, a);
  c.expect_pass(a, dx, rows, cols, nan, what + ", rms_norm_backward");
  a = c.amax();
  d.add_rms_norm_forward(s, x, residual, w, t, rows, cols, 1e-5f, h, y, rstd, a);
  c.expect_pass(a, y, rows, cols, nan, what + ", add_rms_norm_forward");
  a = c.amax();
  d.rms_norm_backward_add(s, h, w, rstd, dy, dresidual, t, rows, cols, dx, dw, a);
  c.expect_pass(a, dx, rows, cols, nan, what + ", rms_norm_backward_add");
}

}  // namespace fsdp::testing
