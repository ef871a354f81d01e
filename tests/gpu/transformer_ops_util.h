// Helpers for test_cuda_transformer_ops.cpp: per-device buffers, the CPU reference device, and
// an element-wise comparison that prints its error statistics (max |ref|, max abs and rel error
// against the stated tolerance) for every op, so a GPU run's log shows how close each op is.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"

namespace fsdp::transformer_test {

// Passes when |got - want| <= rel |want| + abs_frac max|want| for every element.
struct Tolerance {
  double rel = 0, abs_frac = 0;
};
constexpr Tolerance kExact{0, 0};

inline Tolerance elementwise_tolerance(DType t) {
  // bf16: both sides compute the same fp32 value up to a few fp32 ulps and round once, so they
  // differ by at most one bf16 ulp (2^-7 relative at worst).
  return t == DType::F32 ? Tolerance{1e-5, 1e-6} : Tolerance{1e-2, 1e-3};
}

// One output of an op run: its name, values read back as fp32, and how close it must be.
struct Output {
  std::string name;
  std::vector<float> values;
  Tolerance tol;
};

// A device's buffers for one run, freed (stream-ordered) when it goes out of scope.
class Buffers {
 public:
  explicit Buffers(Device& d) : d_(d), s_(d.create_stream("ops", StreamPriority::Normal)) {}
  ~Buffers() {
    for (void* p : owned_) d_.free(p, s_);
    synchronize_in_destructor(d_);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  Device& device() { return d_; }
  Stream stream() const { return s_; }
  void* alloc(size_t bytes) {
    void* p = d_.alloc(bytes ? bytes : 1, s_, MemTag::Other);
    owned_.push_back(p);
    return p;
  }
  void* upload(DType t, const std::vector<float>& values) {
    void* p = alloc(values.size() * dtype_size(t));
    std::vector<uint8_t> bytes(values.size() * dtype_size(t));
    for (size_t i = 0; i < values.size(); ++i) store_from_float(bytes.data(), t, i, values[i]);
    d_.copy_from_host(s_, p, bytes.data(), bytes.size());
    return p;
  }
  int32_t* upload_ids(const std::vector<int32_t>& ids) {
    void* p = alloc(ids.size() * 4);
    d_.copy_from_host(s_, p, ids.data(), ids.size() * 4);
    return static_cast<int32_t*>(p);
  }
  // Filled with NaN, so an element the op fails to write shows up.
  void* poisoned(DType t, int64_t n) {
    void* p = alloc(static_cast<size_t>(n) * dtype_size(t));
    d_.fill(s_, p, t, n, std::nanf(""));
    return p;
  }
  std::vector<float> read(const void* p, DType t, int64_t n) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(t));
    d_.copy_to_host(s_, bytes.data(), p, bytes.size());
    d_.synchronize_stream(s_);
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = load_as_float(bytes.data(), t, i);
    return v;
  }

 private:
  Device& d_;
  Stream s_;
  std::vector<void*> owned_;
};

// The CPU backend's device: the reference every CUDA op is checked against.
struct CpuReference {
  cpu::CpuWorld world{1, {}};
  std::unique_ptr<Device> device = world.make_device(0);
};

inline std::vector<float> uniform(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline void expect_match(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want, Tolerance tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_ref = 0;
  for (float w : want) max_ref = std::max(max_ref, std::fabs(double{w}));
  const double abs_tol = tol.abs_frac * max_ref;
  double max_abs = 0, max_rel = 0;
  int64_t misses = 0;
  std::string first_misses;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i], diff = std::fabs(double{got[i]} - w);
    if (std::isfinite(diff)) {
      max_abs = std::max(max_abs, diff);
      if (std::fabs(w) > 1e-3 * max_ref) max_rel = std::max(max_rel, diff / std::fabs(w));
    }
    if (!(diff <= tol.rel * std::fabs(w) + abs_tol) && ++misses <= 3)
      first_misses += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
                      std::to_string(want[i]) + ";";
  }
  std::printf("  %-58s n=%-9zu max|ref| %-9.3g max abs err %-9.3g max rel err %-9.3g "
              "(tol rel %.0e + %.0e max|ref|)%s\n",
              what.c_str(), got.size(), max_ref, max_abs, max_rel, tol.rel, tol.abs_frac,
              misses ? "  FAIL" : "");
  std::fflush(stdout);
  EXPECT_EQ(misses, 0) << what << ": " << misses << " elements out of tolerance:" << first_misses;
}

// Runs `run` (Buffers& -> std::vector<Output>) on the CPU reference and on GPU 0 and compares
// every output.
template <typename Run>
void compare_with_cpu(const std::string& what, Run&& run) {
  CpuReference cpu;
  auto gpu = cuda::make_device(0);
  std::vector<Output> want, got;
  {
    Buffers b(*cpu.device);
    want = run(b);
  }
  {
    Buffers b(*gpu);
    got = run(b);
  }
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i)
    expect_match(what + " " + got[i].name, got[i].values, want[i].values, got[i].tol);
}

}  // namespace fsdp::transformer_test
