// Argument checks that both backends make at the top of an op, with the same words.
#pragma once

#include "fsdp/device.h"
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

// Note [Device MoE routing]: the shapes, and every buffer present when there are tokens.
inline void check_moe_routing(const Device::MoeRouting& r, const char* op) {
  FSDP_CHECK(r.tokens >= 0 && r.experts >= 1 && r.top_k >= 1 && r.top_k <= r.experts, op,
             ": tokens ", r.tokens, ", experts ", r.experts, ", top_k ", r.top_k);
  FSDP_CHECK(r.group_tokens >= 1 && r.tokens % r.group_tokens == 0 && r.capacity >= 1, op,
             ": ", r.tokens, " tokens in groups of ", r.group_tokens, ", capacity ", r.capacity);
  FSDP_CHECK(r.tokens * r.top_k <= INT32_MAX && r.experts * r.slots() <= INT32_MAX, op,
             ": ", r.tokens, " tokens of top ", r.top_k, " overflow int32 indices");
  if (r.tokens == 0) return;
  check_ptr(r.probs, "probs", op), check_ptr(r.chosen, "chosen", op);
  check_ptr(r.weight, "weight", op), check_ptr(r.slot, "slot", op);
  check_ptr(r.send_assignment, "send_assignment", op), check_ptr(r.send_token, "send_token", op);
  check_ptr(r.send_weight, "send_weight", op), check_ptr(r.aux_grad, "aux_grad", op);
  check_ptr(r.stats, "stats", op);
}

}  // namespace fsdp::backend
