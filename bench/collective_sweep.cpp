// NCCL's all-gather, reduce-scatter and all-reduce over every GPU of this machine, through the
// Comm interface the engine uses, from 4 bytes to 256 MiB: the bus bandwidth by message size
// that a simulation calibration's links.nvlink holds (docs/simulate.md). Rank 0 prints one JSON
// line per collective and size:
//   {"op": "all_gather", "ranks": P, "bytes": S, "us": T, "busbw_gbps": B}
// with S NCCL's message size (the all-gather's output, the reduce-scatter's input, the
// all-reduce's buffer) and B = S / T x (P - 1) / P (twice that for the all-reduce), as
// nccl-tests reports it. Usage: build/bench/collective_sweep [reps=10]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "bench_util.h"
#include "fsdp/comm.h"
#include "fsdp/error.h"
#include "fsdp/launch.h"

namespace {

using namespace fsdp;

double us_per_call(Device& d, Stream s, int reps, const std::function<void()>& body) {
  return bench::us_per_call(d, s, reps, body, /*warmup=*/3, /*rounds=*/5);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 10;
  if (visible_gpu_count() < 2) {
    std::printf("SKIPPED: fewer than 2 GPUs\n");
    return 77;
  }
  try {
    run_cuda_ranks(0, [&](int rank, Device& d, std::shared_ptr<Comm> world) {
      const Stream s = d.create_stream("comm", StreamPriority::High);
      const int P = world->size();
      const size_t max_bytes = size_t{256} << 20;
      void* buf = d.alloc(max_bytes, s, MemTag::Other);
      void* out = d.alloc(max_bytes, s, MemTag::Other);
      d.fill(s, buf, DType::F32, static_cast<int64_t>(max_bytes / 4), 1.0f);
      for (size_t bytes = 4; bytes <= max_bytes; bytes *= 4) {
        const int64_t elems = static_cast<int64_t>(bytes / 4);
        const int64_t chunk = std::max<int64_t>(elems / P, 1);
        struct Case { const char* op; double factor; std::function<void()> run; };
        const Case cases[] = {
            {"all_gather", 1.0, [&] { world->all_gather(buf, out, chunk, DType::F32, s); }},
            {"reduce_scatter", 1.0,
             [&] { world->reduce_scatter(buf, out, chunk, DType::F32, ReduceOp::Sum, s); }},
            {"all_reduce", 2.0,
             [&] { world->all_reduce(buf, out, elems, DType::F32, ReduceOp::Sum, s); }}};
        for (const Case& c : cases) {
          const double us = us_per_call(d, s, reps, c.run);
          const double size = c.factor == 2.0 ? static_cast<double>(elems) * 4
                                              : static_cast<double>(chunk) * P * 4;
          if (rank == 0)
            std::printf("{\"op\": \"%s\", \"ranks\": %d, \"bytes\": %.0f, \"us\": %.2f, "
                        "\"busbw_gbps\": %.2f}\n",
                        c.op, P, size, us, size / (us * 1e3) * c.factor * (P - 1) / P);
          std::fflush(stdout);
        }
      }
      d.synchronize();
      d.free(buf, s);
      d.free(out, s);
      d.synchronize();
    });
  } catch (const Error& e) {
    std::fprintf(stderr, "collective_sweep: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
