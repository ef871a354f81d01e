// What every GPU microbenchmark here does around its body: GPU 0 or a SKIPPED line (exit 77),
// and an fsdp::Error turned into one line and exit 1.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"

namespace fsdp::bench {

inline int run_on_gpu(const char* name, const std::function<void(Device&)>& body) {
  try {
    if (cuda::device_count() == 0) {
      std::printf("SKIPPED: no CUDA GPU\n");
      return 77;
    }
    std::unique_ptr<Device> device = cuda::make_device(0);
    body(*device);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 1;
  }
}

// The median over `rounds` rounds of one call's mean time in microseconds (`reps` calls a
// round, the stream synchronized around each), after `warmup` calls.
inline double us_per_call(Device& d, Stream s, int reps, const std::function<void()>& body,
                          int warmup, int rounds) {
  for (int i = 0; i < warmup; ++i) body();
  d.synchronize_stream(s);
  std::vector<double> us;
  for (int round = 0; round < rounds; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) body();
    d.synchronize_stream(s);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                     .count() / reps);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace fsdp::bench
