// Argument checks that both backends make at the top of an op, with the same words.
#pragma once

#include "fsdp/dtype.h"
#include "fsdp/error.h"

namespace fsdp::backend {

inline void check_ptr(const void* p, const char* what, const char* op) {
  FSDP_CHECK(p != nullptr, op, ": ", what, " is null");
}

inline void check_activation_dtype(DType t, const char* op) {
  FSDP_CHECK(t == DType::F32 || t == DType::BF16, op, ": activations must be fp32 or bf16, got ",
             dtype_name(t));
}

}  // namespace fsdp::backend
