// Element types the engine moves and computes in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace fsdp {

// I32 holds token ids and labels; no arithmetic op takes it.
enum class DType : uint8_t { F32, BF16, I32 };

constexpr size_t dtype_size(DType t) { return t == DType::BF16 ? 2 : 4; }
const char* dtype_name(DType t);
DType parse_dtype(const std::string& name);  // "fp32" | "bf16"; throws Error otherwise

// bf16 on the host: the upper half of an IEEE float, rounded to nearest even.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu))  // NaN stays NaN
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Reads element i of a buffer of type t as float; writes a float as type t.
inline float load_as_float(const void* base, DType t, size_t i) {
  return t == DType::F32 ? static_cast<const float*>(base)[i]
                         : bf16_to_float(static_cast<const uint16_t*>(base)[i]);
}
inline void store_from_float(void* base, DType t, size_t i, float v) {
  if (t == DType::F32)
    static_cast<float*>(base)[i] = v;
  else
    static_cast<uint16_t*>(base)[i] = float_to_bf16(v);
}

}  // namespace fsdp
