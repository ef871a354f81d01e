// The transformer's fused ops alone on one GPU, through the Device interface the engine uses:
// causal GQA attention forward + backward (cuDNN's fused engines, and the CUDA-core kernel that
// FSDP_ATTENTION=simt selects), then RMSNorm (alone and fused with the residual add), the
// cross-entropy loss over the logits, RoPE, SwiGLU and the embedding, at the llama1b
// shape (dim 2048, 32 heads, 4 kv heads, head_dim 64, ffn 5632, vocab 32000), bf16.
// Usage: build/bench/attention_bench [batch=4] [seq=2048] [reps=20] [heads kv_heads head_dim]
// With the three head sizes given, only cuDNN's attention runs, at that shape (GQA against MHA:
// the same heads with kv_heads = heads).
// Attention FLOPs count the causal half: forward 2 matmuls x 2 b h s^2 d / 2, backward 5 of them.
// Memory ops report the bytes they must read and write over their time (GB/s).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "fsdp/nn/transformer.h"

namespace {

using namespace fsdp;

struct Buffers {
  Device& d;
  Stream s;
  std::vector<void*> owned;
  void* get(int64_t n, DType t, float bound = 0.5f) {
    const int64_t cols = 64;
    const int64_t rows = (n + cols - 1) / cols;
    void* p = d.alloc(static_cast<size_t>(rows * cols) * dtype_size(t), s, MemTag::Other);
    d.synthetic_batch(s, p, t, rows, cols, 7 + owned.size(), 0, 0, bound);  // random, no zeros
    owned.push_back(p);
    return p;
  }
  ~Buffers() {
    for (void* p : owned) d.free(p, s);
    synchronize_in_destructor(d);
  }
};

// Median milliseconds of `reps` timed calls of `body` (after 3 warm-up calls).
double median_ms(Device& d, int reps, const std::function<void()>& body) {
  for (int i = 0; i < 3; ++i) body();
  d.synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    d.synchronize();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void report_flops(const std::string& what, double ms, double flops) {
  std::printf("%-44s %9.3f ms  %7.1f TFLOP/s\n", what.c_str(), ms, flops / (ms * 1e-3) / 1e12);
}
void report_bytes(const std::string& what, double ms, double bytes) {
  std::printf("%-44s %9.3f ms  %7.1f GB/s\n", what.c_str(), ms, bytes / (ms * 1e-3) / 1e9);
}

struct Heads {
  int64_t heads = 32, kv_heads = 4, head_dim = 64;  // llama1b's
};

void bench_attention(Device& d, const char* path, int64_t batch, int64_t seq, int reps,
                     Heads h = {}) {
  const int64_t heads = h.heads, kv_heads = h.kv_heads, hd = h.head_dim, rows = batch * seq;
  const int64_t ld = (heads + 2 * kv_heads) * hd, ldo = heads * hd;
  const DType t = DType::BF16;
  const Stream s = d.create_stream("bench", StreamPriority::Normal);
  Buffers b{d, s, {}};
  auto* qkv = static_cast<char*>(b.get(rows * ld, t, 1.0f));
  char* q = qkv;
  char* k = qkv + heads * hd * 2;
  char* v = qkv + (heads + kv_heads) * hd * 2;
  void* out = b.get(rows * ldo, t);
  void* dout = b.get(rows * ldo, t);
  auto* lse = static_cast<float*>(b.get(batch * heads * seq, DType::F32));
  auto* dqkv = static_cast<char*>(b.get(rows * ld, t));
  auto forward = [&] {
    d.attention_forward(s, q, ld, k, ld, v, ld, t, batch, seq, heads, kv_heads, hd, out, ldo, lse);
  };
  auto backward = [&] {
    d.attention_backward(s, q, ld, k, ld, v, ld, out, ldo, dout, ldo, lse, t, batch, seq, heads,
                         kv_heads, hd, dqkv, dqkv + heads * hd * 2,
                         dqkv + (heads + kv_heads) * hd * 2);
  };
  const double matmul_flops = 2.0 * batch * heads * seq * seq * hd / 2;  // causal half
  const std::string shape = " b" + std::to_string(batch) + " s" + std::to_string(seq) + " h" +
                            std::to_string(heads) + "/" + std::to_string(kv_heads) + " d" +
                            std::to_string(hd);
  const double fwd = median_ms(d, reps, forward);
  report_flops(std::string("attention fwd ") + path + shape, fwd, 2 * matmul_flops);
  forward();
  const double bwd = median_ms(d, reps, backward);
  report_flops(std::string("attention bwd ") + path + shape, bwd, 5 * matmul_flops);
  report_flops(std::string("attention fwd+bwd ") + path + shape, fwd + bwd, 7 * matmul_flops);
}

void bench_row_ops(Device& d, int64_t rows, int reps) {
  const int64_t dim = 2048, heads = 32, kv_heads = 4, hd = 64, ffn = 5632, vocab = 32000;
  const DType t = DType::BF16;
  const double e = 2.0;  // bytes per element
  const Stream s = d.create_stream("bench", StreamPriority::Normal);
  Buffers b{d, s, {}};
  void* x = b.get(rows * dim, t);
  void* w = b.get(dim, t);
  void* y = b.get(rows * dim, t);
  void* dy = b.get(rows * dim, t);
  void* dx = b.get(rows * dim, t);
  void* dw = b.get(dim, t);
  auto* rstd = static_cast<float*>(b.get(rows, DType::F32));
  const double act = static_cast<double>(rows) * dim * e;
  report_bytes("rms_norm fwd " + std::to_string(rows) + "x2048",
               median_ms(d, reps, [&] { d.rms_norm_forward(s, x, w, t, rows, dim, 1e-5f, y, rstd, nullptr); }),
               2 * act);
  report_bytes("rms_norm bwd " + std::to_string(rows) + "x2048",
               median_ms(d, reps,
                         [&] { d.rms_norm_backward(s, x, w, rstd, dy, t, rows, dim, dx, dw, nullptr); }),
               3 * act);
  void* r = b.get(rows * dim, t);
  void* h_sum = b.get(rows * dim, t);
  report_bytes("residual add " + std::to_string(rows) + "x2048",
               median_ms(d, reps, [&] { d.add(s, h_sum, x, r, t, rows * dim); }), 3 * act);
  report_bytes("residual add + rms_norm fwd (fused)",
               median_ms(d, reps,
                         [&] {
                           d.add_rms_norm_forward(s, x, r, w, t, rows, dim, 1e-5f, h_sum, y, rstd, nullptr);
                         }),
               4 * act);
  report_bytes("rms_norm bwd + residual add (fused)",
               median_ms(d, reps,
                         [&] {
                           d.rms_norm_backward_add(s, x, w, rstd, dy, r, t, rows, dim, dx, dw, nullptr);
                         }),
               4 * act);
  {
    void* logits = b.get(rows * vocab, t, 8.0f);
    void* dlogits = b.get(rows * vocab, t);
    std::vector<int32_t> host_labels(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) host_labels[static_cast<size_t>(i)] = (i * 104729) % vocab;
    auto* labels = static_cast<int32_t*>(b.get(rows, DType::F32));
    d.copy_from_host(s, labels, host_labels.data(), host_labels.size() * 4);
    auto* loss = static_cast<float*>(b.get(1, DType::F32));
    report_bytes("cross_entropy " + std::to_string(rows) + "x32000 (loss + dlogits)",
                 median_ms(d, reps,
                           [&] {
                             d.cross_entropy_loss(s, logits, t, labels, rows, vocab, loss,
                                                  dlogits);
                           }),
                 2.0 * rows * vocab * e);
  }
  const int64_t ld = (heads + 2 * kv_heads) * hd;
  void* qkv = b.get(rows * ld, t);
  const std::vector<float> inv_freq = nn::rope_inv_freq(hd, 1e4, {});
  report_bytes(
      "rope q+k (in place, ld " + std::to_string(ld) + ")",
      median_ms(
          d, reps,
          [&] { d.rope(s, qkv, ld, t, rows, heads + kv_heads, hd, 2048, inv_freq.data(), false); }),
      2.0 * rows * (heads + kv_heads) * hd * e);
  void* h = b.get(rows * 2 * ffn, t);
  void* g = b.get(rows * ffn, t);
  void* dh = b.get(rows * 2 * ffn, t);
  report_bytes("swiglu fwd " + std::to_string(rows) + "x5632",
               median_ms(d, reps, [&] { d.swiglu_forward(s, h, t, rows, ffn, g, nullptr); }),
               3.0 * rows * ffn * e);
  report_bytes("swiglu bwd " + std::to_string(rows) + "x5632",
               median_ms(d, reps, [&] { d.swiglu_backward(s, h, g, t, rows, ffn, dh, nullptr); }),
               5.0 * rows * ffn * e);
  void* table = b.get(vocab * dim, t);
  void* dtable = b.get(vocab * dim, t);
  std::vector<int32_t> host_ids(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) host_ids[static_cast<size_t>(r)] = (r * 7919) % vocab;
  auto* ids = static_cast<int32_t*>(b.get(rows, DType::F32));
  d.copy_from_host(s, ids, host_ids.data(), host_ids.size() * 4);
  report_bytes("embedding fwd " + std::to_string(rows) + "x2048",
               median_ms(d, reps, [&] { d.embedding_forward(s, table, t, ids, rows, dim, y); }),
               2 * act);
  report_bytes("embedding bwd (writes the 32000x2048 table)",
               median_ms(d, reps,
                         [&] { d.embedding_backward(s, dy, t, ids, rows, dim, vocab, dtable); }),
               act + static_cast<double>(vocab) * dim * e);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 4;
  const int64_t seq = argc > 2 ? std::atoll(argv[2]) : 2048;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 20;
  if (argc == 5 || argc == 6 || argc > 7) {
    std::fprintf(stderr, "attention_bench: the head sizes come as three: heads kv_heads head_dim\n");
    return 2;
  }
  if (argc == 7) {
    const Heads h{std::atoll(argv[4]), std::atoll(argv[5]), std::atoll(argv[6])};
    if (batch < 1 || seq < 1 || reps < 1 || h.heads < 1 || h.kv_heads < 1 || h.head_dim < 1 ||
        h.heads % h.kv_heads != 0) {
      std::fprintf(stderr, "attention_bench: batch, seq, reps and the head sizes must be positive, "
                           "and heads a multiple of kv_heads\n");
      return 2;
    }
    return fsdp::bench::run_on_gpu("attention_bench", [&](fsdp::Device& d) {
      bench_attention(d, "cudnn", batch, seq, reps, h);
    });
  }
  // Each part runs on its own device, so a failure in one (reported as one line) leaves the
  // others measured; the exit status is the worst of the three.
  int rc = fsdp::bench::run_on_gpu(
      "attention_bench", [&](fsdp::Device& d) { bench_attention(d, "cudnn", batch, seq, reps); });
  if (rc == 77) return rc;
  rc = std::max(rc, fsdp::bench::run_on_gpu(
                        "attention_bench", [&](fsdp::Device& d) { bench_row_ops(d, batch * seq, reps); }));
  setenv("FSDP_ATTENTION", "simt", 1);  // the CUDA-core kernel, for comparison
  rc = std::max(rc, fsdp::bench::run_on_gpu("attention_bench", [&](fsdp::Device& d) {
    bench_attention(d, "simt", batch, seq, std::max(3, reps / 4));
  }));
  return rc;
}
