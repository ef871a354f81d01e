// Typed element access for the CPU kernels and collectives. with_io picks the element type
// once per call, outside the loop, so the inner loops compile to straight fp32 or bf16 code
// instead of testing the dtype at every element.
#pragma once

#include <cstdint>

#include "fsdp/dtype.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

struct F32Io {
  static float load(const void* base, int64_t i) { return static_cast<const float*>(base)[i]; }
  static void store(void* base, int64_t i, float v) { static_cast<float*>(base)[i] = v; }
};

struct Bf16Io {
  static float load(const void* base, int64_t i) {
    return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
  static void store(void* base, int64_t i, float v) {
    static_cast<uint16_t*>(base)[i] = float_to_bf16(v);
  }
};

// Calls fn(F32Io{}) or fn(Bf16Io{}) according to t. Any other dtype (I32: token ids) has no
// float kernel: taking it for bf16 would touch half its bytes, so it is an internal error.
template <typename Fn>
void with_io(DType t, Fn&& fn) {
  if (t == DType::F32)
    fn(F32Io{});
  else if (t == DType::BF16)
    fn(Bf16Io{});
  else
    FSDP_FAIL("a float kernel was given ", dtype_name(t), " data");
}

}  // namespace fsdp::cpu
