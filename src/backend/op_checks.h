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

// Note [KV cache]: the shapes of attention_kv_cache, its strides and its buffers.
inline void check_kv_cache_attention(int64_t rows, int64_t position, int64_t capacity,
                                     int64_t heads, int64_t kv_heads, int64_t head_dim,
                                     int64_t ldq, int64_t ldk, int64_t ldv, int64_t ldo,
                                     const char* op) {
  FSDP_CHECK(rows >= 1 && heads >= 1 && kv_heads >= 1 && head_dim >= 1, op, ": rows ", rows,
             ", heads ", heads, ", kv_heads ", kv_heads, ", head_dim ", head_dim,
             " must all be positive");
  FSDP_CHECK(heads % kv_heads == 0, op, ": heads (", heads, ") must be a multiple of kv_heads (",
             kv_heads, ")");
  FSDP_CHECK(position >= 0 && capacity >= 1 && position <= capacity - rows, op, ": rows [",
             position, ", ", position, " + ", rows, ") do not fit a cache of ", capacity);
  FSDP_CHECK(ldq >= heads * head_dim && ldo >= heads * head_dim && ldk >= kv_heads * head_dim &&
                 ldv >= kv_heads * head_dim,
             op, ": a row stride is smaller than its row (ldq ", ldq, ", ldk ", ldk, ", ldv ", ldv,
             ", ldo ", ldo, ")");
}

}  // namespace fsdp::backend
