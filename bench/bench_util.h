// What every GPU microbenchmark here does around its body: GPU 0 or a SKIPPED line (exit 77),
// and an fsdp::Error turned into one line and exit 1.
#pragma once

#include <cstdio>
#include <functional>
#include <memory>

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

}  // namespace fsdp::bench
