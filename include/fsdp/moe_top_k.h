// The top-k rule every MoE routing follows, on the host and in the CPU backend's device op
// (Note [Device MoE routing]; the CUDA kernel follows it too).
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

namespace fsdp {

// Puts a token's top_k experts first in `order` (sized to the expert count): higher
// probability first, the lower expert on ties. Returns the sum of their probabilities, added
// in that order (the weights' normalizer).
inline float moe_top_k(const float* probs, int top_k, std::vector<int>& order) {
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
    return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
  });
  float sum = 0;
  for (int k = 0; k < top_k; ++k) sum += probs[order[k]];
  return sum;
}

}  // namespace fsdp
