// GEMM and attention timings alone on one GPU, through the Device interface the engine uses, at
// the shapes of the models the simulation backend predicts (docs/simulate.md): every Linear of
// llama1b, Llama-3.1-8B and -70B shapes and mlp16 (forward y = x W^T, dX = dy W, dW = dy^T x,
// as nn::Linear issues them) and their causal GQA attention, at 2048, 4096 and 8192 tokens.
// Also the Llama-3.2-1B shape, the 3.0B shape at 16384 tokens (2 sequences of 8192) and the
// MoE transformer's dense Linears at 8192 tokens; then the MoE transformer's grouped expert GEMMs (8 experts, top 2 of 8192 tokens, balanced) and
// its row kernels. Then the memory-bound kernels alone at the llama1b shape at 8192 tokens,
// each with the bytes the simulator counts for it (src/backend/sim/sim_device_ops.cpp). One
// JSON line per op, in the calibration file's terms (Note [Calibration file]):
//   {"op": "gemm", "dtype": "bf16", "m", "n", "k", "layout": "nt", "us"}
//   {"op": "grouped_gemm", "dtype": "bf16", "groups", "m", "n", "k", "layout", "us"}: groups
//    of one shape in one call
//   {"op": "attention_forward" | "attention_backward", "batch", "seq", "heads", "kv_heads",
//    "head_dim", "us"}
//   {"op": "memory", "class": "rms_norm_forward", "bytes", "us"}
// Usage: build/bench/op_sweep [reps=5]   (bench/calibrate_gpu.sh runs it)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <set>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "fsdp/nn/transformer.h"

namespace {

using namespace fsdp;

double us_per_call(Device& d, Stream s, int reps, const std::function<void()>& body) {
  return bench::us_per_call(d, s, reps, body, /*warmup=*/2, /*rounds=*/3);
}

struct Shape {
  int64_t dim, ffn, heads, kv_heads, vocab;
};

class Sweep {
 public:
  Sweep(Device& d, int reps) : d_(d), s_(d.create_stream("compute", StreamPriority::Normal)), reps_(reps) {}
  ~Sweep() {
    d_.synchronize();
    for (void* p : owned_) d_.free(p, s_);
  }

  // Timed once per distinct shape.
  void gemm(int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    if (!gemms_.insert({m, n, k, ta, tb}).second) return;
    void* a = buffer(m * k);
    void* b = buffer(k * n);
    void* c = buffer(m * n);
    const double us = us_per_call(d_, s_, reps_, [&] {
      d_.gemm(s_, ta, tb, m, n, k, 1.0f, a, b, DType::BF16, 0.0f, c, DType::BF16);
    });
    std::printf("{\"op\": \"gemm\", \"dtype\": \"bf16\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
                "\"layout\": \"%c%c\", \"us\": %.2f}\n",
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                ta ? 't' : 'n', tb ? 't' : 'n', us);
    std::fflush(stdout);
    release();
  }

  void linear(int64_t tokens, int64_t in, int64_t out) {
    gemm(tokens, out, in, false, true);   // forward
    gemm(tokens, in, out, false, false);  // dX
    gemm(out, in, tokens, true, false);   // dW
  }

  void attention(int64_t batch, int64_t seq, int64_t heads, int64_t kv, int64_t hd) {
    if (!attentions_.insert({batch, seq, heads, kv, hd}).second) return;
    const int64_t rows = batch * seq, q_cols = heads * hd, kv_cols = kv * hd;
    void* q = buffer(rows * q_cols);
    void* k = buffer(rows * kv_cols);
    void* v = buffer(rows * kv_cols);
    void* out = buffer(rows * q_cols);
    void* dout = buffer(rows * q_cols);
    void* dq = buffer(rows * q_cols);
    void* dk = buffer(rows * kv_cols);
    void* dv = buffer(rows * kv_cols);
    auto* lse = static_cast<float*>(d_.alloc(static_cast<size_t>(batch * heads * seq) * 4, s_, MemTag::Other));
    owned_.push_back(lse);
    const DType t = DType::BF16;
    const double fwd = us_per_call(d_, s_, reps_, [&] {
      d_.attention_forward(s_, q, q_cols, k, kv_cols, v, kv_cols, t, batch, seq, heads, kv, hd,
                           out, q_cols, lse);
    });
    const double bwd = us_per_call(d_, s_, reps_, [&] {
      d_.attention_backward(s_, q, q_cols, k, kv_cols, v, kv_cols, out, q_cols, dout, q_cols, lse,
                            t, batch, seq, heads, kv, hd, dq, dk, dv);
    });
    for (int i = 0; i < 2; ++i)
      std::printf("{\"op\": \"%s\", \"batch\": %lld, \"seq\": %lld, \"heads\": %lld, "
                  "\"kv_heads\": %lld, \"head_dim\": %lld, \"us\": %.2f}\n",
                  i ? "attention_backward" : "attention_forward", static_cast<long long>(batch),
                  static_cast<long long>(seq), static_cast<long long>(heads),
                  static_cast<long long>(kv), static_cast<long long>(hd), i ? bwd : fwd);
    std::fflush(stdout);
    release();
  }

  // `groups` GEMMs of one shape in one grouped call, as GroupedExperts issues them.
  void grouped_gemm(int groups, int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    std::vector<Device::GemmGroup> g(static_cast<size_t>(groups));
    for (auto& e : g) e = {m, n, k, buffer(m * k), buffer(k * n), buffer(m * n)};
    const double us = us_per_call(d_, s_, reps_, [&] {
      d_.grouped_gemm(s_, ta, tb, g.data(), groups, DType::BF16, DType::BF16);
    });
    std::printf("{\"op\": \"grouped_gemm\", \"dtype\": \"bf16\", \"groups\": %d, \"m\": %lld, "
                "\"n\": %lld, \"k\": %lld, \"layout\": \"%c%c\", \"us\": %.2f}\n",
                groups, static_cast<long long>(m), static_cast<long long>(n),
                static_cast<long long>(k), ta ? 't' : 'n', tb ? 't' : 'n', us);
    std::fflush(stdout);
    release();
  }

  // The MoE transformer's experts (src/nn/moe_transformer.cpp) at `rows` rows an expert, and
  // its row kernels over the `sent` rows of top-k routing.
  void moe(int experts, int64_t rows, int64_t dim, int64_t ffn, int64_t tokens, int64_t sent) {
    grouped_gemm(experts, rows, 2 * ffn, dim, false, true);  // fwd w13
    grouped_gemm(experts, rows, dim, ffn, false, true);      // fwd w2
    grouped_gemm(experts, dim, ffn, rows, true, false);      // bwd dW w2
    grouped_gemm(experts, rows, ffn, dim, false, false);     // bwd dX w2
    grouped_gemm(experts, 2 * ffn, dim, rows, true, false);  // bwd dW w13
    grouped_gemm(experts, rows, dim, 2 * ffn, false, false); // bwd dX w13
    const DType bf = DType::BF16;
    void* x = buffer(sent * dim);
    void* y = buffer(sent * dim);
    void* z = buffer(sent * dim);
    auto* w = static_cast<float*>(f32_buffer(sent));
    auto* ids = static_cast<int32_t*>(f32_buffer(sent));
    d_.fill(s_, w, DType::F32, sent, 0.5f);
    d_.fill(s_, ids, DType::F32, sent, 0.0f);  // zero bits: row 0
    const double ds = static_cast<double>(sent), dd = static_cast<double>(dim), b2 = 2;
    auto time = [&](const char* cls, double bytes, const std::function<void()>& run) {
      std::printf("{\"op\": \"memory\", \"class\": \"%s\", \"bytes\": %.0f, \"us\": %.2f}\n", cls,
                  bytes, us_per_call(d_, s_, reps_, run));
      std::fflush(stdout);
    };
    time("scale_rows", ds * dd * b2 * 2 + 4 * ds,
         [&] { d_.scale_rows(s_, y, x, bf, w, 1, sent, dim, false); });
    time("row_dot", 2 * ds * dd * b2 + 4 * ds,
         [&] { d_.row_dot(s_, x, y, bf, w, 1, sent, dim); });
    // The dispatch's gathers: rows of the tokens into send order, and back (a scatter-add).
    time("embedding_forward", 2 * ds * dd * b2 + 4 * ds,
         [&] { d_.embedding_forward(s_, x, bf, ids, sent, dim, z); });
    time("embedding_backward", (ds + static_cast<double>(tokens)) * dd * b2 + 4 * ds,
         [&] { d_.embedding_backward(s_, z, bf, ids, sent, dim, tokens, y); });
    release();
  }

  // The memory-bound kernels, timed alone; bytes as the simulator counts them.
  void memory_ops() {
    const int64_t T = 8192, D = 2048, F = 5632, V = 32000, QKV = 2560, H = 36, HD = 64;
    const DType bf = DType::BF16, f32 = DType::F32;
    const int64_t n = T * D;
    void* x = buffer(T * 2 * F);
    void* y = buffer(T * 2 * F);
    void* z = buffer(T * 2 * F);
    void* w = buffer(D);
    void* logits = buffer(T * V);
    void* dlogits = buffer(T * V);
    void* table = buffer(V * D);
    auto* rstd = static_cast<float*>(f32_buffer(T));
    auto* ids = static_cast<int32_t*>(f32_buffer(T));
    d_.fill(s_, ids, DType::F32, T, 0.0f);  // zero bits: id 0 (fill has no I32 kernel)
    auto* loss = static_cast<float*>(f32_buffer(1));
    const int64_t P = int64_t{64} << 20;  // optimizer and cast: 64 Mi fp32 elements
    auto* p32 = static_cast<float*>(f32_buffer(P));
    auto* g32 = static_cast<float*>(f32_buffer(P));
    auto* m32 = static_cast<float*>(f32_buffer(P));
    auto* v32 = static_cast<float*>(f32_buffer(P));
    void* p16 = buffer(P);
    for (float* b : {p32, g32, m32, v32}) d_.fill(s_, b, f32, P, 0.01f);
    const double b2 = 2, b4 = 4, dn = static_cast<double>(n), dt = static_cast<double>(T);
    auto time = [&](const char* cls, double bytes, const std::function<void()>& run) {
      const double us = us_per_call(d_, s_, reps_, run);
      std::printf("{\"op\": \"memory\", \"class\": \"%s\", \"bytes\": %.0f, \"us\": %.2f}\n", cls,
                  bytes, us);
      std::fflush(stdout);
    };
    time("rms_norm_forward", 2 * dn * b2 + 4 * dt,
         [&] { d_.rms_norm_forward(s_, x, w, bf, T, D, 1e-5f, y, rstd, nullptr); });
    time("rms_norm_backward", 3 * dn * b2 + 4 * dt,
         [&] { d_.rms_norm_backward(s_, x, w, rstd, y, bf, T, D, z, w, nullptr); });
    time("add_rms_norm_forward", 4 * dn * b2 + 4 * dt,
         [&] { d_.add_rms_norm_forward(s_, x, y, w, bf, T, D, 1e-5f, z, x, rstd, nullptr); });
    time("rms_norm_backward_add", 4 * dn * b2 + 4 * dt,
         [&] { d_.rms_norm_backward_add(s_, x, w, rstd, y, z, bf, T, D, z, w, nullptr); });
    const std::vector<float> inv_freq = nn::rope_inv_freq(HD, 10000.0, nn::RopeScaling{});
    time("rope", 2 * dt * H * HD * b2,
         [&] { d_.rope(s_, x, QKV, bf, T, H, HD, 2048, inv_freq.data(), false); });
    time("swiglu_forward", 3 * dt * F * b2, [&] { d_.swiglu_forward(s_, x, bf, T, F, y, nullptr); });
    time("swiglu_backward", 5 * dt * F * b2, [&] { d_.swiglu_backward(s_, x, y, bf, T, F, z, nullptr); });
    time("embedding_forward", 2 * dn * b2 + 4 * dt,
         [&] { d_.embedding_forward(s_, table, bf, ids, T, D, y); });
    time("embedding_backward", (dt + V) * D * b2 + 4 * dt,
         [&] { d_.embedding_backward(s_, y, bf, ids, T, D, V, table); });
    time("cross_entropy_loss", 2 * dt * V * b2 + 4 * dt,
         [&] { d_.cross_entropy_loss(s_, logits, bf, ids, T, V, loss, dlogits); });
    time("add", 3 * dn * b2, [&] { d_.add(s_, z, x, y, bf, n); });
    time("activation_forward", 2 * dn * b2, [&] { d_.activation_forward(s_, Activation::ReLU, x, y, bf, n); });
    time("activation_backward", 3 * dn * b2,
         [&] { d_.activation_backward(s_, Activation::ReLU, x, y, z, bf, n); });
    const double dp = static_cast<double>(P);
    time("copy", 2 * dp * b4, [&] { d_.copy(s_, m32, p32, static_cast<size_t>(P) * 4); });
    time("cast", dp * (b4 + b2), [&] { d_.cast(s_, p16, bf, p32, f32, P); });
    time("accumulate", dp * (8 + b4), [&] { d_.accumulate(s_, m32, g32, f32, P, 1.0f); });
    const float* sq[1] = {g32};
    time("sum_squares", 4 * dp, [&] { d_.sum_squares(s_, sq, &P, 1, loss); });
    OptimTensor o;
    o.param = p32;
    o.grad = g32;
    o.state0 = m32;
    o.state1 = v32;
    o.numel = P;
    o.param_copy = p16;
    o.param_copy_dtype = bf;
    int64_t step = 0;
    time("adamw_step", dp * (8 + 4 + 16 + 2), [&] { d_.adamw_step(s_, &o, 1, AdamWConfig{}, ++step); });
    release();
  }

 private:
  void* f32_buffer(int64_t n) {
    void* p = d_.alloc(static_cast<size_t>(n) * 4, s_, MemTag::Other);
    owned_.push_back(p);
    return p;
  }
  void* buffer(int64_t n) {
    void* p = d_.alloc(static_cast<size_t>(n) * 2, s_, MemTag::Other);
    const int64_t cols = 64;
    d_.synthetic_batch(s_, p, DType::BF16, (n + cols - 1) / cols, cols, 7 + owned_.size(), 0, 0, 0.05f);
    owned_.push_back(p);
    return p;
  }
  void release() {
    d_.synchronize();
    for (void* p : owned_) d_.free(p, s_);
    owned_.clear();
    d_.synchronize();
  }

  Device& d_;
  Stream s_;
  int reps_;
  std::vector<void*> owned_;
  std::set<std::tuple<int64_t, int64_t, int64_t, bool, bool>> gemms_;
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> attentions_;
};

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  return bench::run_on_gpu("op_sweep", [&](Device& d) {
    Sweep sweep(d, reps);
    const Shape models[] = {{2048, 5632, 32, 4, 32000},     // llama1b
                            {4096, 14336, 32, 8, 128256},   // Llama-3.1-8B
                            {8192, 28672, 64, 8, 128256}};  // Llama-3.1-70B
    for (int64_t tokens : {2048, 4096, 8192}) {
      sweep.linear(tokens, 4096, 4096);  // mlp16
      for (const Shape& m : models) {
        const int64_t hd = m.dim / m.heads;
        sweep.linear(tokens, m.dim, (m.heads + 2 * m.kv_heads) * hd);  // fused QKV
        sweep.linear(tokens, m.dim, m.dim);                            // output projection
        sweep.linear(tokens, m.dim, 2 * m.ffn);                        // fused gate and up
        sweep.linear(tokens, m.ffn, m.dim);                            // down
        sweep.linear(tokens, m.dim, m.vocab);                          // LM head
        for (int64_t seq : {2048, 8192})
          if (tokens % seq == 0) sweep.attention(tokens / seq, seq, m.heads, m.kv_heads, hd);
      }
    }
    // The MoE transformer's dense Linears too (FFN 5504, 16/4 heads of 128, vocab 4096): timed
    // by interpolation between other shapes, they came 6-13% over its traced step's GEMMs.
    const Shape llama32_1b{2048, 8192, 32, 8, 128256}, shape_3b{3072, 8192, 24, 8, 32000},
        moe_dense{2048, 5504, 16, 4, 4096};
    for (const auto& [m, tokens, seq] : {std::tuple{llama32_1b, 8192, 2048}, std::tuple{shape_3b, 16384, 8192},
                                         std::tuple{moe_dense, 8192, 2048}}) {
      const int64_t hd = m.dim / m.heads;
      sweep.linear(tokens, m.dim, (m.heads + 2 * m.kv_heads) * hd);
      sweep.linear(tokens, m.dim, m.dim);
      sweep.linear(tokens, m.dim, 2 * m.ffn);
      sweep.linear(tokens, m.ffn, m.dim);
      sweep.linear(tokens, m.dim, m.vocab);
      sweep.attention(tokens / seq, seq, m.heads, m.kv_heads, hd);
    }
    sweep.attention(4, 2048, 16, 4, 128);  // the MoE transformer's
    sweep.moe(8, 2048, 2048, 1408, 8192, 16384);
    sweep.memory_ops();
  });
}
