// Synthetic values that host and device compute identically: parameter init and training
// data. Element j of a stream seeded with `seed` is a pure function of (seed, j), so a GPU
// thread can produce it without the j-1 values before it.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define FSDP_HOST_DEVICE __host__ __device__
#else
#define FSDP_HOST_DEVICE
#endif

namespace fsdp {

// splitmix64 output number j (0-based) of a generator whose state starts at `state0`.
FSDP_HOST_DEVICE inline uint64_t splitmix64_at(uint64_t state0, uint64_t j) {
  uint64_t z = state0 + (j + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform(-bound, bound), element j of the stream `seed`.
FSDP_HOST_DEVICE inline float synthetic_uniform(uint64_t seed, uint64_t j, float bound) {
  const uint64_t bits = splitmix64_at(seed * 0x2545f4914f6cdd1dull + 1, j) >> 11;
  const double u = static_cast<double>(bits) * (1.0 / 9007199254740992.0);
  return static_cast<float>((2.0 * u - 1.0) * bound);
}

// The seed of row `row` of the global batch of `step`: data depends only on (seed, step, row),
// so any rank (or a single-rank reference) can make any slice of the global batch.
FSDP_HOST_DEVICE inline uint64_t synthetic_row_seed(uint64_t seed, int64_t step, int64_t row) {
  return (seed * 0x100000001b3ull) ^ (static_cast<uint64_t>(step) << 40) ^
         static_cast<uint64_t>(row);
}

// The class label of a synthetic row: the argmax (the first, on ties) of its first `width`
// values, a target a linear head can learn. Host and device compute it alike.
FSDP_HOST_DEVICE inline int32_t synthetic_label(uint64_t row_seed, int64_t width, float bound) {
  int32_t best = 0;
  float best_value = synthetic_uniform(row_seed, 0, bound);
  for (int64_t k = 1; k < width; ++k) {
    const float v = synthetic_uniform(row_seed, static_cast<uint64_t>(k), bound);
    if (v > best_value) best = static_cast<int32_t>(k), best_value = v;
  }
  return best;
}

}  // namespace fsdp
