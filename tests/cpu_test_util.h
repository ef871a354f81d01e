// Helpers shared by the CPU backend tests: moving values between host vectors and device
// buffers in either dtype, and a one-device test fixture.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "fsdp/dtype.h"

namespace fsdp::cpu::cpu_test {

using Floats = std::vector<float>;

// Deterministic inputs in [-scale, scale], different for each salt.
inline Floats values(int64_t n, float scale, int salt) {
  Floats v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * i + 1.3f * salt + 0.1f);
  return v;
}

inline float round_to(DType t, float v) {
  return t == DType::F32 ? v : bf16_to_float(float_to_bf16(v));
}

inline void* upload(Device& d, Stream s, const Floats& v, DType t, MemTag tag = MemTag::Other) {
  std::vector<char> host(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) store_from_float(host.data(), t, i, v[i]);
  void* p = d.alloc(host.size(), s, tag);
  d.copy_from_host(s, p, host.data(), host.size());
  return p;
}

inline Floats download(Device& d, Stream s, const void* p, int64_t n, DType t) {
  std::vector<char> host(static_cast<size_t>(n) * dtype_size(t));
  d.copy_to_host(s, host.data(), p, host.size());
  d.synchronize_stream(s);
  Floats out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(host.data(), t, i);
  return out;
}

// A test with one CPU device and one stream; the buffers it makes are freed after the test.
class DeviceTest : public ::testing::Test {
 protected:
  CpuWorld world{1, {}};
  std::unique_ptr<Device> dev = world.make_device(0);
  Stream s = dev->create_stream("s", StreamPriority::Normal);
  std::vector<void*> owned;

  void* put(const Floats& v, DType t = DType::F32) {
    return owned.emplace_back(upload(*dev, s, v, t));
  }
  void* fresh(int64_t n, DType t = DType::F32) {  // NaN-poisoned in checked mode
    return owned.emplace_back(dev->alloc(n * dtype_size(t), s, MemTag::Other));
  }
  Floats get(const void* p, int64_t n, DType t = DType::F32) { return download(*dev, s, p, n, t); }
  void TearDown() override {
    for (void* p : owned) dev->free(p, s);
    dev->synchronize();
  }
};

}  // namespace fsdp::cpu::cpu_test
