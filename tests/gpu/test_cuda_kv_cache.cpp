// The CUDA backend's KV-cache ops (Note [KV cache] in fsdp/device.h) against the CPU backend's:
// rope_at on a fused qkv buffer, and attention_kv_cache run as generation runs it (a prompt at
// once, then one token at a time), with caches longer than one tile of the kernel (128 keys),
// GQA, and head_dim 64 and 128, in fp32 and bf16.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "fsdp/nn/transformer.h"
#include "transformer_ops_util.h"

namespace fsdp {
namespace {

using transformer_test::Buffers;
using transformer_test::compare_with_cpu;
using transformer_test::elementwise_tolerance;
using transformer_test::Output;
using transformer_test::Tolerance;
using transformer_test::uniform;

class CudaKvCache : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  }
};

struct Shape {
  int64_t prompt, steps, heads, kv_heads, head_dim;
};

TEST_F(CudaKvCache, PrefillThenDecodeMatchesCpu) {
  for (const Shape sh : {Shape{5, 4, 3, 1, 10}, Shape{200, 70, 32, 8, 64}, Shape{129, 3, 8, 2, 128}})
    for (DType t : {DType::F32, DType::BF16}) {
      const int64_t seq = sh.prompt + sh.steps, qw = sh.heads * sh.head_dim;
      const int64_t kvw = sh.kv_heads * sh.head_dim, ld = qw + 2 * kvw;
      std::mt19937 rng(23);
      const auto qkv = uniform(rng, static_cast<size_t>(seq * ld), -2, 2);
      const std::vector<float> freqs = nn::rope_inv_freq(sh.head_dim, 500000.0, {});
      const std::string what = std::string("kv cache ") + dtype_name(t) + " prompt " +
                               std::to_string(sh.prompt) + " hd " + std::to_string(sh.head_dim);
      compare_with_cpu(what, [&](Buffers& b) {
        Device& d = b.device();
        auto* x = static_cast<char*>(b.upload(t, qkv));
        void* k_cache = b.poisoned(t, seq * kvw);
        void* v_cache = b.poisoned(t, seq * kvw);
        auto* out = static_cast<char*>(b.poisoned(t, seq * qw));
        const size_t es = dtype_size(t);
        for (int64_t at = 0; at < seq; at += at == 0 ? sh.prompt : 1) {
          const int64_t rows = at == 0 ? sh.prompt : 1;
          char* row = x + at * ld * es;
          d.rope_at(b.stream(), row, ld, t, rows, sh.heads, sh.head_dim, at, freqs.data());
          d.rope_at(b.stream(), row + qw * es, ld, t, rows, sh.kv_heads, sh.head_dim, at,
                    freqs.data());
          d.attention_kv_cache(b.stream(), row, ld, row + qw * es, ld, row + (qw + kvw) * es, ld,
                               t, rows, at, seq, sh.heads, sh.kv_heads, sh.head_dim, k_cache,
                               v_cache, out + at * qw * es, qw);
        }
        return std::vector<Output>{
            {"qkv", b.read(x, t, seq * ld), elementwise_tolerance(t)},
            {"k_cache", b.read(k_cache, t, seq * kvw), elementwise_tolerance(t)},
            {"out", b.read(out, t, seq * qw),
             t == DType::F32 ? Tolerance{1e-4, 1e-5} : Tolerance{3e-2, 1e-2}}};
      });
    }
}

}  // namespace
}  // namespace fsdp
