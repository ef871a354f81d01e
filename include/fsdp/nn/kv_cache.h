// The KV cache of text generation (Note [KV cache] in fsdp/device.h): each decoder block's
// keys and values of the tokens seen so far, and the blocks' forward on new tokens against it.
#pragma once

#include <cstdint>

#include "fsdp/module.h"

namespace fsdp::nn {

// One block's cache: keys and values, each [capacity, kv_heads * head_dim] in the activation
// dtype; rows [0, position) hold the tokens before the ones a call adds.
struct LayerKvCache {
  Tensor k, v;
  int64_t capacity() const { return k.rows; }
};

// A block that can run its forward on the new tokens of one sequence, at positions
// [position, position + x.rows), reading the earlier tokens' keys and values from its cache and
// adding the new ones to it. It computes what its forward() computes for those rows of the
// whole sequence (the same modules, the same weights), with no FSDP hooks and nothing kept for
// a backward.
class CachedBlock {
 public:
  virtual ~CachedBlock() = default;
  // The width of a cache row: kv_heads * head_dim.
  virtual int64_t kv_width() const = 0;
  virtual Tensor forward_cached(RunContext& ctx, const Tensor& x, LayerKvCache& cache,
                                int64_t position) = 0;
};

}  // namespace fsdp::nn
