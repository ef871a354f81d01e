// Choosing the next token from a row of logits: greedy, or a seeded draw from the
// temperature-scaled softmax restricted to its top-p nucleus (Hugging Face's do_sample with
// temperature and top_p, and no other warper).
#pragma once

#include <cstdint>
#include <span>

namespace fsdp::generate {

struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax); else softmax(logits / temperature)
  double top_p = 1;        // keep the most likely tokens whose probabilities reach top_p
  uint64_t seed = 0;       // the draws: a pure function of (seed, step)
};

// One-line OptionErrors naming temperature and top_p: temperature finite and >= 0, top_p in
// (0, 1].
void check_sampling(const SamplingOptions& options);

// The token of step `step` (0 for the first new token).
//   - temperature 0: the argmax, the lowest id among equal maxima (torch.argmax's choice);
//   - else p_i = softmax(logits / temperature) in double; the tokens in order of falling p
//     (lower id first on ties) are kept while the sum of the ones before stays below top_p,
//     so at least one is kept and the one that crosses top_p is in; the draw is
//     u * (their sum), u in [0, 1) from splitmix64_at(seed, step), walked in that order.
// A non-finite logit is an error (the model's weights hold a NaN or an infinity).
int32_t next_token(std::span<const float> logits, const SamplingOptions& options, int64_t step);

}  // namespace fsdp::generate
