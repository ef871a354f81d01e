// Host cost of each Device/Comm call the schedule makes per block, on one GPU: where the
// microseconds of host_schedule_us_per_unit go. Each call is timed over many repetitions,
// with the GPU kept ahead (tiny work), and reported in microseconds per call.
// Usage: build/bench/host_costs [reps=2000]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "bench_util.h"

namespace {
double time_us(int reps, const std::function<void()>& call) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) call();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace fsdp;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 2000;
  return bench::run_on_gpu("host_costs", [&](Device& d) {
    auto comm = cuda::make_world_comm(d, cuda::make_unique_id(), 0, 1);
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    const Stream s2 = d.create_stream("side", StreamPriority::High);
    const Event e = d.create_event();
    void* a = d.alloc(64 * 64 * 2, s, MemTag::Other);
    void* b = d.alloc(64 * 64 * 2, s, MemTag::Other);
    void* c = d.alloc(64 * 64 * 2, s, MemTag::Other);
    d.fill(s, a, DType::BF16, 64 * 64, 0.5f);
    d.fill(s, b, DType::BF16, 64 * 64, 0.5f);
    d.synchronize();
    struct Row { const char* name; std::function<void()> call; };
    const std::vector<Row> rows = {
        {"alloc + free (1 MiB)", [&] { d.free(d.alloc(1 << 20, s, MemTag::Other), s); }},
        {"fill kernel", [&] { d.fill(s, c, DType::BF16, 64 * 64, 1.0f); }},
        {"cast kernel", [&] { d.cast(s, c, DType::BF16, a, DType::BF16, 64 * 64); }},
        {"gemm 64^3 (cuBLASLt)", [&] { d.gemm(s, false, true, 64, 64, 64, 1.0f, a, b, DType::BF16, 0.0f, c, DType::BF16); }},
        {"record + wait event", [&] { d.record_event(e, s); d.wait_event(s2, e); }},
        {"all_gather, 1 rank (NCCL)", [&] { comm->all_gather(a, c, 64 * 64, DType::BF16, s); }},
        {"reduce_scatter, 1 rank (NCCL)", [&] { comm->reduce_scatter(a, c, 64 * 64, DType::BF16, ReduceOp::Avg, s); }},
        {"set_label", [&] { d.set_label("fwd layers.0 gemm"); }},
    };
    std::printf("{");
    for (size_t i = 0; i < rows.size(); ++i) {
      time_us(reps / 10, rows[i].call);  // warm-up: plan caches, pools
      d.synchronize();
      const double us = time_us(reps, rows[i].call);
      d.synchronize();
      std::printf("%s\"%s\": %.2f", i ? ", " : "", rows[i].name, us);
    }
    std::printf("}\n");
    for (void* p : {a, b, c}) d.free(p, s);
    d.synchronize();
    d.destroy_event(e);
  });
}
