// fp8 on the CPU backend (docs/fp8.md): the emulation the CUDA kernels are checked against.
// Casts use the host conversions of fsdp/fp8.h (round to nearest even, saturation); the GEMM
// multiplies the codes' exact values in fp32 (an fp8 product is exact in fp32) with the same
// fp32 accumulation as the bf16 GEMM, then applies the inverse scales.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/cpu_dtype_io.h"
#include "backend/cpu/cpu_kernels.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

namespace {

using Axis = Device::Fp8Axis;

void check_fp8_shape(const char* op, const void* x, DType t, int64_t rows, int64_t cols) {
  FSDP_CHECK(rows >= 0 && cols >= 0, op, ": rows ", rows, ", cols ", cols);
  FSDP_CHECK(t == DType::F32 || t == DType::BF16, op, ": x must be fp32 or bf16, got ",
             dtype_name(t));
  FSDP_CHECK(rows * cols == 0 || x != nullptr, op, ": x is null");
}

int64_t amax_count(Axis axis, int64_t rows, int64_t cols) {
  return axis == Axis::Tensor ? 1 : axis == Axis::Rows ? rows : cols;
}

int64_t amax_index(Axis axis, int64_t r, int64_t c) {
  return axis == Axis::Tensor ? 0 : axis == Axis::Rows ? r : c;
}

float round_to(float v, DType value_t) {
  return value_t == DType::BF16 ? bf16_to_float(float_to_bf16(v)) : v;
}

// The 256 values of one format, decoded once.
const std::array<float, 256>& decode_table(Fp8Format f) {
  static const auto make = [](Fp8Format g) {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = fp8_to_float(static_cast<uint8_t>(c), g);
    return t;
  };
  static const std::array<float, 256> e4m3 = make(Fp8Format::E4M3), e5m2 = make(Fp8Format::E5M2);
  return f == Fp8Format::E4M3 ? e4m3 : e5m2;
}

// max that propagates NaN (std::max would drop it when it comes second).
float max_abs(float acc, float v) {
  const float a = std::fabs(v);
  return std::isnan(acc) || std::isnan(a) ? NAN : std::max(acc, a);
}

}  // namespace

namespace kernels {
float abs_max(const void* x, DType t, int64_t n) {
  float a = 0.0f;
  with_io(t, [&](auto io) {
    for (int64_t i = 0; i < n; ++i) a = max_abs(a, io.load(x, i));
  });
  return a;
}
}  // namespace kernels

void CpuDevice::fp8_amax(Stream s, const void* x, DType t, int64_t rows, int64_t cols,
                         Fp8Axis axis, float* amax) {
  const char* op = "fp8_amax";
  check_fp8_shape(op, x, t, rows, cols);
  FSDP_CHECK(amax != nullptr, op, ": amax is null");
  enqueue(s, OpKind::Kernel, [=] {
    if (axis == Axis::Tensor) {
      *amax = kernels::abs_max(x, t, rows * cols);
      return;
    }
    std::fill(amax, amax + amax_count(axis, rows, cols), 0.0f);
    with_io(t, [&](auto io) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          float& a = amax[amax_index(axis, r, c)];
          a = max_abs(a, io.load(x, r * cols + c));
        }
    });
  });
}

void CpuDevice::fp8_cast(Stream s, const void* x, DType t, DType value_t, int64_t rows,
                         int64_t cols, Fp8Axis axis, const float* amax, Fp8Format f, uint8_t* q,
                         uint8_t* q_t, float* scale_inv) {
  const char* op = "fp8_cast";
  check_fp8_shape(op, x, t, rows, cols);
  FSDP_CHECK(amax != nullptr && (rows * cols == 0 || q != nullptr || q_t != nullptr), op,
             ": a null buffer");
  enqueue(s, OpKind::Kernel, [=] {
    const int64_t n = amax_count(axis, rows, cols);
    std::vector<float> scale(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      scale[static_cast<size_t>(i)] = fp8_scale_of(round_to(amax[i], value_t), f);
      if (scale_inv) scale_inv[i] = 1.0f / scale[static_cast<size_t>(i)];
    }
    with_io(t, [&](auto io) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const float v = round_to(io.load(x, r * cols + c), value_t);
          const uint8_t code =
              float_to_fp8(v * scale[static_cast<size_t>(amax_index(axis, r, c))], f);
          if (q) q[r * cols + c] = code;
          if (q_t) q_t[c * rows + r] = code;
        }
    });
  });
}

void CpuDevice::fp8_gemm(Stream s, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                         Fp8Operand a, Fp8Operand b, bool rowwise, void* c, DType c_t) {
  check_fp8_gemm(m, n, k, a, b, c);
  enqueue(s, OpKind::Kernel, [=] {
    if (m == 0 || n == 0) return;
    const std::array<float, 256>& ta = decode_table(a.format);
    const std::array<float, 256>& tb = decode_table(b.format);
    std::vector<float> a32(static_cast<size_t>(m * k)), b32(static_cast<size_t>(k * n)),
        c32(static_cast<size_t>(m * n));
    for (size_t i = 0; i < a32.size(); ++i) a32[i] = ta[a.data[i]];
    for (size_t i = 0; i < b32.size(); ++i) b32[i] = tb[b.data[i]];
    kernels::gemm(trans_a, trans_b, m, n, k, 1.0f, a32.data(), b32.data(), DType::F32, 0.0f,
                  c32.data(), DType::F32);
    with_io(c_t, [&](auto io) {
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const float scale = a.scale_inv[rowwise ? i : 0] * b.scale_inv[rowwise ? j : 0];
          io.store(c, i * n + j, c32[static_cast<size_t>(i * n + j)] * scale);
        }
    });
  });
}

}  // namespace fsdp::cpu
