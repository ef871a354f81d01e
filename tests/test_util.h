// Helpers shared by the engine tests: run FSDP on CPU rank threads, run the reference.
#pragma once

#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "runtime/launch.h"
#include "runtime/trainer.h"

namespace fsdp::testing {

inline std::vector<runtime::RankResult> run_fsdp(int world, const runtime::TrainConfig& config,
                                                 cpu::CpuOptions options = {}) {
  std::vector<runtime::RankResult> results(world);
  runtime::run_cpu_ranks(world, options, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    results[rank] = runtime::train_rank(device, comm, config);
  });
  return results;
}

inline runtime::RankResult run_reference(const runtime::TrainConfig& config, int world) {
  runtime::RankResult result;
  runtime::run_cpu_ranks(1, {}, [&](int, Device& device, std::shared_ptr<Comm>) {
    result = runtime::train_local_reference(device, config, world);
  });
  return result;
}

// ||a - b|| / ||b|| over all params.
inline double relative_error(const std::vector<std::vector<float>>& a,
                             const std::vector<std::vector<float>>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) {
      const double d = static_cast<double>(a[i][j]) - b[i][j];
      diff += d * d;
      norm += static_cast<double>(b[i][j]) * b[i][j];
    }
  return std::sqrt(diff / (norm > 0 ? norm : 1));
}

inline int64_t tag_peak_live(const runtime::RankResult& r, MemTag tag) {
  return r.memory.tag_peak_live[static_cast<int>(tag)];
}

}  // namespace fsdp::testing
