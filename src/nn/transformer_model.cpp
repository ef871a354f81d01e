// The transformer's sizes from a ModelConfig, and its synthetic token batches. Its module
// tree is built by its model family (src/models/llama.cpp).
#include "fsdp/error.h"
#include "fsdp/synthetic.h"
#include "fsdp/nn/model.h"

namespace fsdp::nn {

TransformerConfig transformer_config(const ModelConfig& m) {
  TransformerConfig c;
  c.layers = m.layers;
  c.dim = m.dim;
  c.heads = m.heads;
  c.kv_heads = m.kv_heads > 0 ? m.kv_heads : m.heads;
  if (m.ffn_dim > 0) {
    c.ffn_dim = m.ffn_dim;
  } else {
    const int64_t two_thirds_of_4x = (8 * m.dim + 2) / 3;  // SwiGLU's 2/3 of 4 * dim, rounded up
    c.ffn_dim = (two_thirds_of_4x + 63) / 64 * 64;
  }
  c.seq_len = m.seq_len;
  c.vocab = m.vocab;
  c.head_size = m.head_dim;
  c.rope_theta = m.rope_theta;
  c.rope_scaling = m.rope_scaling;
  c.norm_eps = static_cast<float>(m.norm_eps);
  c.tie_embeddings = m.tie_embeddings;
  c.attention_bias = m.attention_bias;
  c.seed = m.seed;
  c.validate();
  FSDP_USER_CHECK(m.sliding_window >= 0, "sliding_window must be >= 0 (0: none), got ",
                  m.sliding_window);
  FSDP_USER_CHECK(m.sliding_window == 0 || m.sliding_window >= m.seq_len, "sliding_window ",
                  m.sliding_window, " is shorter than seq_len ", m.seq_len,
                  ": sliding-window attention is not implemented (a window at least as long "
                  "as the sequences changes nothing)");
  return c;
}

TokenBatch make_token_batch(const ModelConfig& config, uint64_t seed, int step, int64_t first_row,
                            int64_t tokens) {
  const int64_t seq = config.seq_len, vocab = config.vocab;
  FSDP_CHECK(seq >= 1 && vocab >= 1, "seq_len and vocab must be positive");
  FSDP_CHECK(tokens % seq == 0 && first_row % seq == 0, "tokens (", tokens,
             ") must be a multiple of seq_len (", seq, ") for the transformer");
  TokenBatch out;
  out.ids.reserve(static_cast<size_t>(tokens));
  out.labels.reserve(static_cast<size_t>(tokens));
  std::vector<int32_t> sequence(static_cast<size_t>(seq + 1));
  for (int64_t row = first_row; row < first_row + tokens; row += seq) {
    const uint64_t row_seed = synthetic_row_seed(seed, step, row);
    for (int64_t p = 0; p <= seq; ++p) {
      const uint64_t r = splitmix64_at(row_seed, static_cast<uint64_t>(p));
      const uint64_t previous = p > 0 ? static_cast<uint64_t>(sequence[p - 1]) : 0;
      const bool random = p == 0 || (r & 3u) == 0;
      sequence[static_cast<size_t>(p)] = static_cast<int32_t>(
          random ? (r >> 8) % static_cast<uint64_t>(vocab)
                 : (previous * 5 + 3) % static_cast<uint64_t>(vocab));
    }
    out.ids.insert(out.ids.end(), sequence.begin(), sequence.end() - 1);
    out.labels.insert(out.labels.end(), sequence.begin() + 1, sequence.end());
  }
  return out;
}

}  // namespace fsdp::nn
