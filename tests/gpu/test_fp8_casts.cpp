// fp8 on CUDA against the CPU backend (docs/fp8.md): the amaxes, inverse scales and fp8 codes
// bit for bit on random tensors (with zeros, ties, values beyond the formats' range and a
// zero row), per tensor, row and column, from fp32 and bf16, rounded through bf16 or not; and
// the cuBLASLt fp8 GEMM, tensorwise and rowwise, in every transpose, to fp32 accumulation's
// tolerance.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "transformer_ops_util.h"

namespace fsdp {
namespace {

using transformer_test::Buffers;
using transformer_test::compare_with_cpu;
using transformer_test::kExact;
using transformer_test::Output;
using transformer_test::Tolerance;
using transformer_test::uniform;
using Axis = Device::Fp8Axis;

class CudaFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  }
};

std::vector<float> awkward_values(std::mt19937& rng, int64_t rows, int64_t cols) {
  std::vector<float> v = uniform(rng, static_cast<size_t>(rows * cols), -3, 3);
  for (size_t i = 0; i < v.size(); i += 7) v[i] *= 1e4f;    // beyond E4M3 after scaling
  for (size_t i = 3; i < v.size(); i += 11) v[i] *= 1e-6f;  // subnormal after scaling
  for (size_t i = 5; i < v.size(); i += 13) v[i] = 0.0f;
  for (size_t i = 9; i < v.size(); i += 17) v[i] = 0.5f + 1.0f / 32;  // a tie in E4M3 at scale 1
  for (int64_t c = 0; c < cols; ++c) v[static_cast<size_t>(cols + c)] = 0.0f;  // row 1: zeros
  return v;
}

std::vector<float> bytes_as_floats(Buffers& b, const uint8_t* q, int64_t n) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  b.device().copy_to_host(b.stream(), bytes.data(), q, bytes.size());
  b.device().synchronize_stream(b.stream());
  return std::vector<float>(bytes.begin(), bytes.end());
}

// 37 x 203 takes the generic kernel; 80 x 72 and 128 x 192 the tiles of Note [Fp8 cast tiles]
// (partial and whole), each with and without the transposed codes.
TEST_F(CudaFp8, CastsAgreeBitForBitWithTheCpu) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 203}, {80, 72}, {128, 192}})
  for (bool transposed : {false, true})
  for (Axis axis : {Axis::Tensor, Axis::Rows, Axis::Cols})
    for (DType t : {DType::F32, DType::BF16})
      for (DType value_t : {DType::F32, DType::BF16})
        for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
          if (t == DType::BF16 && value_t == DType::F32) continue;  // already bf16 values
          std::mt19937 rng(5);
          const std::vector<float> x = awkward_values(rng, rows, cols);
          const int64_t scales = axis == Axis::Tensor ? 1 : axis == Axis::Rows ? rows : cols;
          const std::string what = std::string("fp8_cast ") + fp8_format_name(f) + " " +
                                   dtype_name(t) + " via " + dtype_name(value_t) + " axis " +
                                   std::to_string(static_cast<int>(axis)) + " " +
                                   std::to_string(rows) + "x" + std::to_string(cols) +
                                   (transposed ? " with q_t" : "");
          compare_with_cpu(what, [&](Buffers& b) {
            void* dx = b.upload(t, x);
            auto* amax = static_cast<float*>(b.poisoned(DType::F32, scales));
            auto* scale_inv = static_cast<float*>(b.poisoned(DType::F32, scales));
            auto* q = static_cast<uint8_t*>(b.alloc(static_cast<size_t>(rows * cols)));
            auto* q_t = transposed ? static_cast<uint8_t*>(b.alloc(static_cast<size_t>(rows * cols)))
                                   : nullptr;
            b.device().fp8_amax(b.stream(), dx, t, rows, cols, axis, amax);
            b.device().fp8_cast(b.stream(), dx, t, value_t, rows, cols, axis, amax, f, q, q_t,
                                scale_inv);
            std::vector<Output> out{{"amax", b.read(amax, DType::F32, scales), kExact},
                                    {"scale_inv", b.read(scale_inv, DType::F32, scales), kExact},
                                    {"codes", bytes_as_floats(b, q, rows * cols), kExact}};
            if (q_t) out.push_back({"transposed codes", bytes_as_floats(b, q_t, rows * cols), kExact});
            return out;
          });
        }
}

// Every layout, both recipes, the three format pairs the linears use (forward e4m3 x e4m3
// with fast accumulation; the gradients with an e5m2 side) and both output types.
TEST_F(CudaFp8, GemmMatchesTheCpuInEveryLayout) {
  const int64_t m = 64, n = 48, k = 96;
  const std::pair<Fp8Format, Fp8Format> pairs[] = {{Fp8Format::E4M3, Fp8Format::E4M3},
                                                   {Fp8Format::E5M2, Fp8Format::E4M3},
                                                   {Fp8Format::E4M3, Fp8Format::E5M2}};
  for (bool rowwise : {false, true})
    for (const auto& [fa, fb] : pairs)
      for (DType c_t : {DType::BF16, DType::F32})
        for (bool trans_a : {false, true})
          for (bool trans_b : {false, true}) {
            std::mt19937 rng(11);
            const auto a = uniform(rng, static_cast<size_t>(m * k), -2, 2);
            const auto bv = uniform(rng, static_cast<size_t>(k * n), -0.05f, 0.05f);
            const std::string what =
                std::string("fp8_gemm") + (rowwise ? " rowwise" : " tensorwise") +
                (fa == Fp8Format::E5M2 ? " e5m2" : " e4m3") +
                (fb == Fp8Format::E5M2 ? "xe5m2" : "xe4m3") + " c=" + dtype_name(c_t) +
                (trans_a ? " A^T" : " A") + (trans_b ? " B^T" : " B");
            compare_with_cpu(what, [&](Buffers& b) {
              Device& d = b.device();
              // op(A) rows and op(B) columns carry the rowwise scales: A's rows unless
              // transposed, B's columns unless transposed.
              const int64_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
              const int64_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
              const Axis a_axis = !rowwise ? Axis::Tensor : trans_a ? Axis::Cols : Axis::Rows;
              const Axis b_axis = !rowwise ? Axis::Tensor : trans_b ? Axis::Rows : Axis::Cols;
              void* da = b.upload(DType::BF16, a);
              void* db = b.upload(DType::BF16, bv);
              auto* qa = static_cast<uint8_t*>(b.alloc(static_cast<size_t>(m * k)));
              auto* qb = static_cast<uint8_t*>(b.alloc(static_cast<size_t>(k * n)));
              auto* sa = static_cast<float*>(b.poisoned(DType::F32, 2 * m));
              auto* sb = static_cast<float*>(b.poisoned(DType::F32, 2 * n));
              d.fp8_amax(b.stream(), da, DType::BF16, a_rows, a_cols, a_axis, sa);
              d.fp8_cast(b.stream(), da, DType::BF16, DType::BF16, a_rows, a_cols, a_axis, sa,
                         fa, qa, nullptr, sa + m);
              d.fp8_amax(b.stream(), db, DType::BF16, b_rows, b_cols, b_axis, sb);
              d.fp8_cast(b.stream(), db, DType::BF16, DType::BF16, b_rows, b_cols, b_axis, sb,
                         fb, qb, nullptr, sb + n);
              void* c = b.poisoned(c_t, m * n);
              d.fp8_gemm(b.stream(), trans_a, trans_b, m, n, k, {qa, fa, sa + m},
                         {qb, fb, sb + n}, rowwise, c, c_t);
              return std::vector<Output>{{"C", b.read(c, c_t, m * n), Tolerance{1e-2, 2e-3}}};
            });
          }
}

// llama1b's forward QKV GEMM, 8192 x 2560 x 2048 e4m3 x e4m3: cuBLASLt refused every algorithm
// for it on the H200 while the scales sat 4 bytes past their amaxes (Note [Fp8 scales 16-byte
// aligned]); here each sits in its own 16-byte slot, as the trainer's do.
TEST_F(CudaFp8, GemmAtLlama1bsForwardShape) {
  const int64_t m = 8192, n = 2560, k = 2048;
  std::mt19937 rng(12);
  const auto a = uniform(rng, static_cast<size_t>(m * k), -2, 2);
  const auto w = uniform(rng, static_cast<size_t>(n * k), -0.05f, 0.05f);
  compare_with_cpu("fp8_gemm tensorwise e4m3xe4m3 8192x2560x2048", [&](Buffers& b) {
    Device& d = b.device();
    void* da = b.upload(DType::BF16, a);
    void* dw = b.upload(DType::BF16, w);
    auto* qa = static_cast<uint8_t*>(b.alloc(static_cast<size_t>(m * k)));
    auto* qw = static_cast<uint8_t*>(b.alloc(static_cast<size_t>(n * k)));
    auto* scales = static_cast<float*>(b.poisoned(DType::F32, 4 * kFp8ScaleSlot));
    float* const slot[4] = {scales, scales + kFp8ScaleSlot, scales + 2 * kFp8ScaleSlot,
                            scales + 3 * kFp8ScaleSlot};
    d.fp8_amax(b.stream(), da, DType::BF16, m, k, Axis::Tensor, slot[0]);
    d.fp8_cast(b.stream(), da, DType::BF16, DType::BF16, m, k, Axis::Tensor, slot[0],
               Fp8Format::E4M3, qa, nullptr, slot[1]);
    d.fp8_amax(b.stream(), dw, DType::BF16, n, k, Axis::Tensor, slot[2]);
    d.fp8_cast(b.stream(), dw, DType::BF16, DType::BF16, n, k, Axis::Tensor, slot[2],
               Fp8Format::E4M3, qw, nullptr, slot[3]);
    void* c = b.poisoned(DType::BF16, m * n);
    d.fp8_gemm(b.stream(), false, true, m, n, k, {qa, Fp8Format::E4M3, slot[1]},
               {qw, Fp8Format::E4M3, slot[3]}, false, c, DType::BF16);
    return std::vector<Output>{{"C", b.read(c, DType::BF16, m * n), Tolerance{1e-2, 2e-3}}};
  });
}

}  // namespace
}  // namespace fsdp
