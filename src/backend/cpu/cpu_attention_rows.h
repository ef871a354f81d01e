// The CPU backend's RoPE and attention rows, shared by the training ops
// (cpu_transformer_ops.cpp) and the KV cache's (cpu_kv_cache_ops.cpp, Note [KV cache] in
// fsdp/device.h): both run these very loops, so a token's rotation and its attention row come
// out bit for bit the same whichever op computed them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fsdp::cpu {

// One (batch, kv head)'s keys or values as a dense fp32 [seq, head_dim] block: read once per
// block instead of once per query row.
template <typename Io>
void gather_head(const void* src, int64_t ld, int64_t first_token, int64_t col, int64_t seq,
                 int64_t head_dim, std::vector<float>& out) {
  out.resize(static_cast<size_t>(seq * head_dim));
  for (int64_t j = 0; j < seq; ++j)
    for (int64_t c = 0; c < head_dim; ++c)
      out[static_cast<size_t>(j * head_dim + c)] = Io::load(src, (first_token + j) * ld + col + c);
}

// Eight running sums (a fixed order, so still deterministic) let the compiler vectorize what a
// single sum's dependency chain would serialize.
inline float dot(const float* a, const float* b, int64_t n) {
  float part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) part[k] += a[i + k] * b[i + k];
  float s = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Row r is at position first_position + r % seq_len.
template <typename Io>
void rope_kernel(void* x, int64_t ld, int64_t rows, int64_t heads, int64_t head_dim,
                 int64_t seq_len, int64_t first_position, const std::vector<float>& inv_freq,
                 bool inverse) {
  const int64_t half = head_dim / 2;
  // The angle is fp32, as Hugging Face's LlamaRotaryEmbedding computes it.
  std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
  for (int64_t r = 0; r < rows; ++r) {
    const float pos = static_cast<float>(first_position + r % seq_len);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq[static_cast<size_t>(i)];
      cos_v[static_cast<size_t>(i)] = std::cos(angle);
      sin_v[static_cast<size_t>(i)] = inverse ? -std::sin(angle) : std::sin(angle);
    }
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = r * ld + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = Io::load(x, base + i), b = Io::load(x, base + i + half);
        const float c = cos_v[static_cast<size_t>(i)], s = sin_v[static_cast<size_t>(i)];
        Io::store(x, base + i, a * c - b * s);
        Io::store(x, base + i + half, b * c + a * s);
      }
    }
  }
}

// One query row against the first `keys` rows of one head's dense keys kh and values vh
// ([keys, hd] fp32): out[out_at + c] = softmax(scale q.k_j) . v_j[c], rounded once. Returns
// the row's log-sum-exp. p and acc are scratch.
template <typename Io>
float attend_row(const float* qrow, const float* kh, const float* vh, int64_t keys, int64_t hd,
                 float scale, std::vector<float>& p, std::vector<float>& acc, void* out,
                 int64_t out_at) {
  if (static_cast<int64_t>(p.size()) < keys) p.resize(static_cast<size_t>(keys));
  acc.assign(static_cast<size_t>(hd), 0.0f);
  float max_s = -INFINITY;
  for (int64_t j = 0; j < keys; ++j) {
    p[static_cast<size_t>(j)] = scale * dot(qrow, kh + j * hd, hd);
    max_s = std::max(max_s, p[static_cast<size_t>(j)]);
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < keys; ++j) {
    p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - max_s);
    sum += p[static_cast<size_t>(j)];
  }
  for (int64_t j = 0; j < keys; ++j) {
    const float pj = p[static_cast<size_t>(j)];
    const float* vj = vh + j * hd;
    for (int64_t c = 0; c < hd; ++c) acc[static_cast<size_t>(c)] += pj * vj[c];
  }
  const float inv_sum = 1.0f / sum;
  for (int64_t c = 0; c < hd; ++c) Io::store(out, out_at + c, acc[static_cast<size_t>(c)] * inv_sum);
  return max_s + std::log(sum);
}

}  // namespace fsdp::cpu
