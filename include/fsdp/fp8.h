// The two 8-bit float formats of fp8 training (docs/fp8.md), on the host: OCP's E4M3 ("fn":
// no infinities, one NaN pattern per sign) and E5M2 (IEEE-like, with infinities), converted
// as NVIDIA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) converts: round to nearest even,
// finite values beyond the largest and infinities saturate to it (keeping their sign), NaN
// becomes 0x7f (the sign dropped). The CPU backend casts with these functions and the CUDA
// backend with the hardware instruction; tests/gpu checks they agree bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace fsdp {

enum class Fp8Format : uint8_t { E4M3, E5M2 };
const char* fp8_format_name(Fp8Format f);  // "e4m3" | "e5m2"

// What an fp8 Linear's GEMMs run in (--fp8). None: the param dtype, as without fp8.
// Tensorwise: one scale per tensor. Rowwise: one scale per row of each GEMM operand along its
// non-reduced dimension (cuBLASLt's "outer vector" scaling).
enum class Fp8Recipe : uint8_t { None, Tensorwise, Rowwise };
const char* fp8_recipe_name(Fp8Recipe r);          // "none" | "tensorwise" | "rowwise"
Fp8Recipe parse_fp8_recipe(const std::string& s);  // throws a one-line UserError otherwise

struct Fp8Spec {
  int exponent_bits, mantissa_bits, bias;
  float max;  // the largest finite value
};
constexpr Fp8Spec fp8_spec(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Fp8Spec{4, 3, 7, 448.0f} : Fp8Spec{5, 2, 15, 57344.0f};
}
constexpr uint8_t kFp8NaN = 0x7f;

// Note [Fp8 scales 16-byte aligned]
// Device::fp8_gemm takes each operand's inverse scales (one, or a rowwise vector) starting at a
// multiple of 16 bytes: on the H200 cuBLASLt refused every algorithm for llama1b's forward
// GEMM when a scale sat 4 bytes past an amax. Every backend checks it (Device::check_fp8_gemm),
// so the CPU suite catches a misplaced scale; the callers give each tensor's scales a slot of
// kFp8ScaleSlot floats (16 bytes), fp8_scale_slots(n) floats for n scales.
constexpr int64_t kFp8ScaleSlot = 4;
constexpr int64_t fp8_scale_slots(int64_t scales) {
  return (scales + kFp8ScaleSlot - 1) / kFp8ScaleSlot * kFp8ScaleSlot;
}

// The exact value of an fp8 code.
inline float fp8_to_float(uint8_t code, Fp8Format f) {
  const Fp8Spec s = fp8_spec(f);
  const int mant_mask = (1 << s.mantissa_bits) - 1;
  const int exp_mask = (1 << s.exponent_bits) - 1;
  const bool negative = (code & 0x80) != 0;
  const int e = (code >> s.mantissa_bits) & exp_mask;
  const int m = code & mant_mask;
  float v;
  if (f == Fp8Format::E4M3 && e == exp_mask && m == mant_mask) {
    v = NAN;  // S.1111.111: E4M3's only NaN; the rest of its top binade is finite
  } else if (f == Fp8Format::E5M2 && e == exp_mask) {
    v = m == 0 ? INFINITY : NAN;
  } else if (e == 0) {  // subnormal: m * 2^(1 - bias - mantissa_bits)
    v = std::ldexp(static_cast<float>(m), 1 - s.bias - s.mantissa_bits);
  } else {
    v = std::ldexp(static_cast<float>(m + (1 << s.mantissa_bits)), e - s.bias - s.mantissa_bits);
  }
  return negative ? -v : v;
}

// Round to nearest even with saturation (see the top of the file).
inline uint8_t float_to_fp8(float x, Fp8Format f) {
  if (std::isnan(x)) return kFp8NaN;
  const Fp8Spec s = fp8_spec(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  const int max_exp_field = f == Fp8Format::E4M3 ? 15 : 30;
  const uint8_t max_code = static_cast<uint8_t>(
      (max_exp_field << s.mantissa_bits) |
      (f == Fp8Format::E4M3 ? (1 << s.mantissa_bits) - 2 : (1 << s.mantissa_bits) - 1));
  if (!(a < s.max)) return sign | max_code;  // saturation, infinities included
  // The spacing of representable values around a: 2^(e - mantissa_bits) in a's binade
  // [2^e, 2^(e+1)), and the subnormals' spacing below the smallest normal 2^(1 - bias).
  int e = 0;
  (void)std::frexp(a, &e);  // a = f * 2^e with f in [0.5, 1): a's binade is 2^(e-1)
  const int min_normal_exp = 1 - s.bias;
  const int binade = std::max(e - 1, min_normal_exp);
  const int quantum_exp = binade - s.mantissa_bits;
  // a / quantum is exact (a power-of-two scale) and below 2^(mantissa_bits + 1): nearbyint
  // rounds it to nearest even in the default rounding mode.
  const float q = std::nearbyint(std::ldexp(a, -quantum_exp));
  const int units = static_cast<int>(q);  // value = units * 2^quantum_exp
  if (units == 0) return sign;
  // units in [2^m, 2^(m+1)] in a normal binade (2^(m+1) carries into the next one); below
  // 2^m only for subnormals.
  int exp_field, mant;
  if (units < (1 << s.mantissa_bits)) {
    exp_field = 0;
    mant = units;
  } else if (units == (2 << s.mantissa_bits)) {
    exp_field = binade + 1 + s.bias;
    mant = 0;
  } else {
    exp_field = binade + s.bias;
    mant = units - (1 << s.mantissa_bits);
  }
  const uint8_t code = static_cast<uint8_t>((exp_field << s.mantissa_bits) | mant);
  return code > max_code ? (sign | max_code) : (sign | code);  // rounding up past the max
}

// Note [Fp8 scale]
// A tensor (or a row) with largest magnitude amax is cast as fp8(x * scale) with
// scale = max / max(amax, kFp8AmaxFloor), in fp32, so its largest element lands on the
// format's largest value; the floor (torchao's EPS) keeps an all-zero tensor finite. The GEMM
// multiplies its fp32 accumulator by the operands' inverse scales, 1 / scale, also fp32.
constexpr float kFp8AmaxFloor = 1e-12f;
inline float fp8_scale_of(float amax, Fp8Format f) {
  return fp8_spec(f).max / std::max(amax, kFp8AmaxFloor);
}

}  // namespace fsdp
