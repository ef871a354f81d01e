// The GEMMs of one mlp16 training step alone, on one GPU, through the same Device::gemm the
// engine uses: the floor that "our 1-GPU step within 5% of its GEMMs" is measured against.
// Usage: build/bench/gemm_floor [tokens=8192] [dim=4096] [layers=16] [reps=20]
//
// `gemm_floor llama [tokens=8192] [reps=20]`: every GEMM shape of the llama1b transformer (dim
// 2048, 32 heads, 4 kv heads, ffn 5632, vocab 32000, 22 layers) alone, as Linear issues them
// (forward y = x W^T, dX = dy W, dW = dy^T x), one JSON line each with its TFLOP/s; each dW also
// with a memory-bound stream running beside it (as the optimizer or the reduce-scatter copy-in
// can), and a last line with the step's GEMM time (22 layers + the LM head). FSDP_GEMM_AUTOTUNE=1
// (Note [GEMM autotune]) times the plans' candidates instead of taking cuBLASLt's first choice.
//
// Both modes end with one "step_floor" line: the GEMMs alone plus AdamW's memory traffic at the
// device-copy bandwidth measured here (a 1 GiB device-to-device copy, read + write counted). AdamW
// over P fp32 params reads param, grad, exp_avg and exp_avg_sq and writes all but the grad:
// 28 bytes per param. Nothing else in a step (norms, activations, collectives) is counted, so a
// real step can only be slower.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

using namespace fsdp;

double ms_per_call(Device& d, Stream s, int reps, const std::function<void()>& body);

constexpr double kAdamWBytesPerParam = 28;

// Device-to-device copy bandwidth in GB/s (bytes read + bytes written per second).
double copy_gbps(Device& d, Stream s) {
  const size_t bytes = size_t{1} << 30;
  void* a = d.alloc(bytes, s, MemTag::Other);
  void* b = d.alloc(bytes, s, MemTag::Other);
  d.fill(s, a, DType::F32, static_cast<int64_t>(bytes / 4), 1.0f);
  const double ms = ms_per_call(d, s, 5, [&] { d.copy(s, b, a, bytes); });
  d.free(a, s);
  d.free(b, s);
  d.synchronize();
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

void print_step_floor(Device& d, Stream s, double gemm_ms, double params) {
  const double gbps = copy_gbps(d, s);
  const double optimizer_bytes = kAdamWBytesPerParam * params;
  const double optimizer_ms = optimizer_bytes / (gbps * 1e9) * 1e3;
  std::printf("{\"step_floor_ms\": %.3f, \"gemm_ms\": %.3f, \"optimizer_ms\": %.3f, "
              "\"optimizer_bytes\": %.0f, \"params\": %.0f, \"copy_gbps\": %.0f}\n",
              gemm_ms + optimizer_ms, gemm_ms, optimizer_ms, optimizer_bytes, params, gbps);
  std::fflush(stdout);
}

double ms_per_call(Device& d, Stream s, int reps, const std::function<void()>& body) {
  for (int i = 0; i < 3; ++i) body();
  d.synchronize_stream(s);
  std::vector<double> ms;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) body();
    d.synchronize_stream(s);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count() / reps);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void llama_gemms(Device& d, int64_t tokens, int reps) {
  const Stream s = d.create_stream("compute", StreamPriority::Normal);
  const Stream side = d.create_stream("side", StreamPriority::Normal);
  const DType t = DType::BF16;
  std::vector<void*> owned;
  auto buffer = [&](int64_t rows, int64_t cols) {
    void* p = d.alloc(static_cast<size_t>(rows * cols) * 2, s, MemTag::Other);
    d.synthetic_batch(s, p, t, rows, cols, 7 + owned.size(), 0, 0, 0.05f);  // random, no zeros
    owned.push_back(p);
    return p;
  };
  // A memory-bound neighbour: fp32 accumulate over 256 MiB, like an optimizer pass.
  const int64_t side_n = int64_t{64} << 20;
  auto* side_dst = static_cast<float*>(d.alloc(static_cast<size_t>(side_n) * 4, side, MemTag::Other));
  void* side_src = d.alloc(static_cast<size_t>(side_n) * 4, side, MemTag::Other);
  d.fill(side, side_dst, DType::F32, side_n, 0.0f);
  d.fill(side, side_src, DType::F32, side_n, 1e-3f);
  d.synchronize();

  struct Linear { const char* name; int64_t in, out, count; };
  const int layers = 22;
  const Linear linears[] = {{"wqkv", 2048, 2560, layers}, {"wo", 2048, 2048, layers},
                            {"w13", 2048, 11264, layers}, {"w2", 5632, 2048, layers},
                            {"output", 2048, 32000, 1}};
  double step_ms = 0, step_flops = 0;
  for (const Linear& l : linears) {
    void* x = buffer(tokens, l.in);
    void* w = buffer(l.out, l.in);
    void* y = buffer(tokens, l.out);
    void* dx = buffer(tokens, l.in);
    void* dw = buffer(l.out, l.in);
    const double flops = 2.0 * tokens * l.in * l.out;
    struct Op { const char* what; std::function<void()> run; };
    const Op ops[] = {
        {"fwd", [&] { d.gemm(s, false, true, tokens, l.out, l.in, 1.0f, x, w, t, 0.0f, y, t); }},
        {"dX", [&] { d.gemm(s, false, false, tokens, l.in, l.out, 1.0f, y, w, t, 0.0f, dx, t); }},
        {"dW", [&] { d.gemm(s, true, false, l.out, l.in, tokens, 1.0f, y, x, t, 0.0f, dw, t); }}};
    for (const Op& op : ops) {
      const double ms = ms_per_call(d, s, reps, op.run);
      step_ms += ms * static_cast<double>(l.count);
      step_flops += flops * static_cast<double>(l.count);
      std::printf("{\"gemm\": \"%s %s\", \"tokens\": %lld, \"in\": %lld, \"out\": %lld, "
                  "\"ms\": %.4f, \"tflops\": %.1f}\n",
                  l.name, op.what, static_cast<long long>(tokens), static_cast<long long>(l.in),
                  static_cast<long long>(l.out), ms, flops / (ms * 1e-3) / 1e12);
      if (std::strcmp(op.what, "dW") != 0) continue;
      // The same dW while the side stream streams memory the whole time.
      const double contended = ms_per_call(d, s, reps, [&] {
        for (int i = 0; i < 2; ++i)
          d.accumulate(side, side_dst, side_src, DType::F32, side_n, 1.0f);
        op.run();
      });
      d.synchronize();
      std::printf("{\"gemm\": \"%s dW beside a memory-bound stream\", \"ms\": %.4f, "
                  "\"tflops\": %.1f}\n",
                  l.name, contended, flops / (contended * 1e-3) / 1e12);
    }
    std::fflush(stdout);
  }
  std::printf("{\"gemm\": \"llama1b step (22 layers + head)\", \"tokens\": %lld, "
              "\"ms\": %.3f, \"tflops\": %.1f, \"autotune\": \"%s\"}\n",
              static_cast<long long>(tokens), step_ms, step_flops / (step_ms * 1e-3) / 1e12,
              std::getenv("FSDP_GEMM_AUTOTUNE") ? std::getenv("FSDP_GEMM_AUTOTUNE") : "0");
  d.synchronize();
  for (void* p : owned) d.free(p, s);
  d.free(side_dst, side);
  d.free(side_src, side);
  d.synchronize();
  // Every weight of the step's GEMMs, plus the embedding and the norms.
  double params = 2048.0 * 32000 + 2048 + layers * 2.0 * 2048;
  for (const Linear& l : linears) params += static_cast<double>(l.in) * l.out * l.count;
  print_step_floor(d, s, step_ms, params);
}

// `gemm_floor llama-fp8 [tokens=8192] [reps=20] [tensorwise|rowwise]` (docs/fp8.md): the
// blocks' GEMMs as --fp8 runs them (Device::fp8_gemm, with the weight's transpose it makes for
// dX), each alone and with the amaxes and casts that nn::fp8_linear makes before it; the LM
// head stays bf16. The step line is the fp8 GEMM floor
// of a step, with and without the casts.
void llama_fp8_gemms(Device& d, int64_t tokens, int reps, bool rowwise) {
  using Axis = Device::Fp8Axis;
  const Stream s = d.create_stream("compute", StreamPriority::Normal);
  const DType t = DType::BF16;
  std::vector<void*> owned;
  auto buffer = [&](int64_t rows, int64_t cols, DType type) {
    void* p = d.alloc(static_cast<size_t>(rows * cols) * dtype_size(type), s, MemTag::Other);
    d.synthetic_batch(s, p, type, rows, cols, 7 + owned.size(), 0, 0, 0.05f);
    owned.push_back(p);
    return p;
  };
  auto bytes = [&](int64_t n) {
    void* p = d.alloc(static_cast<size_t>(n), s, MemTag::Other);
    owned.push_back(p);
    return static_cast<uint8_t*>(p);
  };
  struct Linear { const char* name; int64_t in, out, count; };
  const int layers = 22;
  const Linear linears[] = {{"wqkv", 2048, 2560, layers}, {"wo", 2048, 2048, layers},
                            {"w13", 2048, 11264, layers}, {"w2", 5632, 2048, layers}};
  double gemm_ms = 0, with_casts_ms = 0, step_flops = 0;
  for (const Linear& l : linears) {
    // Operands as the three GEMMs take them: x [tokens, in], W [out, in], dy [tokens, out].
    void* x = buffer(tokens, l.in, t);
    void* w = buffer(l.out, l.in, t);
    void* dy = buffer(tokens, l.out, t);
    void* out = buffer(tokens, std::max(l.in, l.out), t);
    void* dw = buffer(l.out, l.in, t);
    // Each operand's scales in 16-byte slots (Note [Fp8 scales 16-byte aligned]).
    const int64_t most = fp8_scale_slots(std::max({tokens, l.in, l.out}));
    auto* scales = static_cast<float*>(static_cast<void*>(bytes(12 * most * 4)));
    uint8_t* qx = bytes(tokens * l.in);
    uint8_t* qx_t = bytes(tokens * l.in);
    uint8_t* qw = bytes(l.out * l.in);
    uint8_t* qdy = bytes(tokens * l.out);
    uint8_t* qdy_t = bytes(tokens * l.out);
    // As nn::fp8_quantize does: the amax (unless an earlier one serves), then the cast into the
    // plain and/or transposed codes; `slot` keeps each operand's scales apart.
    auto amax = [&](int slot) { return scales + 2 * slot * most; };
    auto inv = [&](int slot) { return scales + 2 * slot * most + most; };
    auto cast = [&](const void* src, int64_t rows, int64_t cols, Axis axis, Fp8Format f,
                    uint8_t* q, uint8_t* q_t, int slot, bool reuse_amax = false) {
      if (!reuse_amax) d.fp8_amax(s, src, t, rows, cols, axis, amax(slot));
      d.fp8_cast(s, src, t, t, rows, cols, axis, amax(slot), f, q, q_t,
                 reuse_amax ? nullptr : inv(slot));
    };
    const Axis rows = rowwise ? Axis::Rows : Axis::Tensor, cols = rowwise ? Axis::Cols : Axis::Tensor;
    cast(x, tokens, l.in, rows, Fp8Format::E4M3, qx, nullptr, 0);
    cast(w, l.out, l.in, rows, Fp8Format::E4M3, qw, nullptr, 1);
    cast(dy, tokens, l.out, rows, Fp8Format::E5M2, qdy, qdy_t, 2);
    cast(dy, tokens, l.out, cols, Fp8Format::E5M2, nullptr, qdy_t, 4);
    cast(x, tokens, l.in, cols, Fp8Format::E4M3, nullptr, qx_t, 5);
    d.synchronize();
    const double flops = 2.0 * tokens * l.in * l.out;
    struct Op {
      const char* what;
      std::function<void()> gemm, casts;
    };
    // Note [Fp8 operands reused by the weight grad]: tensorwise, dY is cast once into both
    // layouts before dX and X^T is cast with the forward's amax; rowwise takes new amaxes along
    // the other axes. The weight is cast as FSDP's float8 all-gather would (tensorwise) or per
    // GEMM (rowwise).
    const int dy_slot = rowwise ? 4 : 2, x_slot = rowwise ? 5 : 0;
    const Op ops[] = {
        {"fwd",
         [&] { d.fp8_gemm(s, false, true, tokens, l.out, l.in, {qx, Fp8Format::E4M3, inv(0)},
                          {qw, Fp8Format::E4M3, inv(1)}, rowwise, out, t); },
         [&] { cast(x, tokens, l.in, rows, Fp8Format::E4M3, qx, nullptr, 0);
               cast(w, l.out, l.in, rows, Fp8Format::E4M3, qw, nullptr, 1); }},
        {"dX",
         [&] { d.fp8_gemm(s, false, false, tokens, l.in, l.out, {qdy, Fp8Format::E5M2, inv(2)},
                          {qw, Fp8Format::E4M3, inv(rowwise ? 3 : 1)}, rowwise, out, t); },
         [&] { cast(dy, tokens, l.out, rows, Fp8Format::E5M2, qdy, rowwise ? nullptr : qdy_t, 2);
               if (rowwise) cast(w, l.out, l.in, cols, Fp8Format::E4M3, qw, nullptr, 3); }},
        {"dW",
         [&] { d.fp8_gemm(s, false, true, l.out, l.in, tokens,
                          {qdy_t, Fp8Format::E5M2, inv(dy_slot)},
                          {qx_t, Fp8Format::E4M3, inv(x_slot)}, rowwise, dw, t); },
         [&] { if (rowwise) cast(dy, tokens, l.out, cols, Fp8Format::E5M2, nullptr, qdy_t, 4);
               cast(x, tokens, l.in, cols, Fp8Format::E4M3, nullptr, qx_t, x_slot, !rowwise); }}};
    for (const Op& op : ops) {
      // Each timing starts from the operands its own casts leave (scales per its layout).
      op.casts();
      const double ms = ms_per_call(d, s, reps, op.gemm);
      const double both = ms_per_call(d, s, reps, [&] { op.casts(); op.gemm(); });
      gemm_ms += ms * static_cast<double>(l.count);
      with_casts_ms += both * static_cast<double>(l.count);
      step_flops += flops * static_cast<double>(l.count);
      std::printf("{\"gemm\": \"%s %s fp8 %s\", \"tokens\": %lld, \"in\": %lld, \"out\": %lld, "
                  "\"ms\": %.4f, \"tflops\": %.1f, \"with_casts_ms\": %.4f}\n",
                  l.name, op.what, rowwise ? "rowwise" : "tensorwise",
                  static_cast<long long>(tokens), static_cast<long long>(l.in),
                  static_cast<long long>(l.out), ms, flops / (ms * 1e-3) / 1e12, both);
    }
    std::fflush(stdout);
  }
  // The head in bf16, as --fp8 leaves it.
  void* x = buffer(tokens, 2048, t);
  void* w = buffer(32000, 2048, t);
  void* y = buffer(tokens, 32000, t);
  void* dw = buffer(32000, 2048, t);
  const double head_ms =
      ms_per_call(d, s, reps, [&] { d.gemm(s, false, true, tokens, 32000, 2048, 1.0f, x, w, t, 0.0f, y, t); }) +
      ms_per_call(d, s, reps, [&] { d.gemm(s, false, false, tokens, 2048, 32000, 1.0f, y, w, t, 0.0f, x, t); }) +
      ms_per_call(d, s, reps, [&] { d.gemm(s, true, false, 32000, 2048, tokens, 1.0f, y, x, t, 0.0f, dw, t); });
  std::printf("{\"gemm\": \"llama1b step fp8 %s (22 layers, the head in bf16)\", \"tokens\": %lld, "
              "\"ms\": %.3f, \"with_casts_ms\": %.3f, \"head_bf16_ms\": %.3f, "
              "\"block_tflops\": %.1f}\n",
              rowwise ? "rowwise" : "tensorwise", static_cast<long long>(tokens),
              gemm_ms + head_ms, with_casts_ms + head_ms, head_ms,
              step_flops / (gemm_ms * 1e-3) / 1e12);
  d.synchronize();
  for (void* p : owned) d.free(p, s);
  d.synchronize();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "llama-fp8") == 0) {
    const int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 8192;
    const int reps = argc > 3 ? std::atoi(argv[3]) : 20;
    const bool rowwise = argc > 4 && std::strcmp(argv[4], "rowwise") == 0;
    return bench::run_on_gpu("gemm_floor",
                             [&](Device& d) { llama_fp8_gemms(d, tokens, reps, rowwise); });
  }
  if (argc > 1 && std::strcmp(argv[1], "llama") == 0) {
    const int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 8192;
    const int reps = argc > 3 ? std::atoi(argv[3]) : 20;
    return bench::run_on_gpu("gemm_floor", [&](Device& d) { llama_gemms(d, tokens, reps); });
  }
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
    for (void* p : weights) d.free(p, s);
    for (void* p : acts) d.free(p, s);
    d.free(grad_w, s);
    d.free(grad_x, s);
    d.synchronize();
    print_step_floor(d, s, median, static_cast<double>(layers) * dim * dim);
  });
}
