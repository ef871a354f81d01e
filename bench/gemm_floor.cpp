// The GEMMs of one mlp16 training step alone, on one GPU, through the same Device::gemm the
// engine uses: the floor that "our 1-GPU step within 5% of its GEMMs" is measured against.
// Usage: build/bench/gemm_floor [tokens=8192] [dim=4096] [layers=16] [reps=20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_util.h"

int main(int argc, char** argv) {
  using namespace fsdp;
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 8192;
  const int64_t dim = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int layers = argc > 3 ? std::atoi(argv[3]) : 16;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 20;
  return bench::run_on_gpu("gemm_floor", [&](Device& d) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    const DType t = DType::BF16;
    auto buffer = [&](int64_t n) {
      void* p = d.alloc(static_cast<size_t>(n) * 2, s, MemTag::Other);
      d.synthetic_batch(s, p, t, n / dim, dim, 7, 0, 0, 0.05f);  // random, never zeros
      return p;
    };
    std::vector<void*> weights, acts;
    for (int l = 0; l < layers; ++l) weights.push_back(buffer(dim * dim));
    for (int l = 0; l <= layers; ++l) acts.push_back(buffer(tokens * dim));
    void* grad_w = buffer(dim * dim);
    void* grad_x = buffer(tokens * dim);
    auto step = [&] {
      for (int l = 0; l < layers; ++l)  // forward: y = x W^T
        d.gemm(s, false, true, tokens, dim, dim, 1.0f, acts[l], weights[l], t, 0.0f, acts[l + 1], t);
      for (int l = layers - 1; l >= 0; --l) {  // backward: dW = dy^T x, dx = dy W
        d.gemm(s, true, false, dim, dim, tokens, 1.0f, acts[l + 1], acts[l], t, 0.0f, grad_w, t);
        if (l > 0)  // as the engine does: the data needs no gradient
          d.gemm(s, false, false, tokens, dim, dim, 1.0f, acts[l + 1], weights[l], t, 0.0f, grad_x, t);
      }
    };
    for (int i = 0; i < 3; ++i) step();
    d.synchronize();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      d.synchronize();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double flops = 2.0 * (3 * layers - 1) * dim * dim * tokens;  // 3L - 1 GEMMs
    std::printf("{\"tokens\": %lld, \"dim\": %lld, \"layers\": %d, \"gemm_ms_median\": %.3f, "
                "\"tflops\": %.1f}\n",
                static_cast<long long>(tokens), static_cast<long long>(dim), layers, median,
                flops / (median * 1e-3) / 1e12);
  });
}
