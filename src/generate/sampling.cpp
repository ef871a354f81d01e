#include "generate/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/synthetic.h"

namespace fsdp::generate {

void check_sampling(const SamplingOptions& o) {
  FSDP_OPTION_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, OptionName{"temperature"},
                    " must be a number >= 0 (0: greedy), got ", o.temperature);
  FSDP_OPTION_CHECK(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1, OptionName{"top_p"},
                    " must be in (0, 1], got ", o.top_p);
}

int32_t next_token(std::span<const float> logits, const SamplingOptions& o, int64_t step) {
  check_sampling(o);
  FSDP_CHECK(!logits.empty(), "next_token: no logits");
  for (size_t i = 0; i < logits.size(); ++i)
    FSDP_USER_CHECK(std::isfinite(logits[i]), "the model's logit of token ", i, " is ", logits[i],
                    " (its weights hold a NaN or an infinity)");
  const auto best = std::max_element(logits.begin(), logits.end());  // the first of equal maxima
  if (o.temperature == 0) return static_cast<int32_t>(best - logits.begin());
  const double top = *best;
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - top) / o.temperature);
  for (double& v : p) v /= sum;
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  size_t kept = 0;
  double mass = 0;
  while (kept < order.size() && (kept == 0 || mass < o.top_p)) mass += p[order[kept++]];
  const double u = static_cast<double>(splitmix64_at(o.seed, static_cast<uint64_t>(step)) >> 11) *
                   0x1p-53;
  const double target = u * mass;
  double walked = 0;
  for (size_t k = 0; k < kept; ++k) {
    walked += p[order[k]];
    if (target < walked) return order[k];
  }
  return order[kept - 1];  // u * mass rounded up to the whole mass
}

}  // namespace fsdp::generate
