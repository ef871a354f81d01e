// The grouped experts the fp8 tests run on the CPU and on CUDA: four experts of block 1, their
// weights from the model's own init (tests set other values where they need them).
#pragma once

#include <memory>

#include "fsdp/nn/moe.h"

namespace fsdp::testing {

inline std::unique_ptr<nn::GroupedExperts> four_experts(int64_t dim, int64_t ffn, uint64_t seed) {
  nn::TransformerConfig tc;
  tc.dim = dim;
  tc.seed = seed;
  nn::MoeConfig mc;
  mc.experts = 4;
  mc.expert_ffn_dim = ffn;
  return std::make_unique<nn::GroupedExperts>(tc, mc, 1);
}

}  // namespace fsdp::testing
