// Causal grouped-query attention through cuDNN's fused flash-attention engines (bf16), forward
// and backward, built with the graph backend API (Note [cuDNN graphs]) and cached per shape.
//
// Note [cuDNN attention]
// The graphs are the ones cuDNN's fused SDPA engines match (the same composition cuDNN's own
// frontend emits for cuDNN 9 before the unified softmax op):
//   forward:  S = Q K^T * scale; causal mask (row >= col, else -inf); M = rowmax S;
//             E = exp(S - M); Z = rowsum E; stats = M + log Z; O = (E / Z) V.
//   backward: delta = rowsum(dO * O); P = exp(mask(Q K^T * scale - stats)); dV = P^T dO;
//             dS = P (dO V^T - delta) * scale; dK = dS^T Q; dQ = dS K,
//             with dK and dV summed over each kv head's query heads (GQA).
// Tensors are [batch, heads, seq, head_dim] views of the engine's [tokens, width] rows: strides
// [seq*ld, head_dim, ld, 1], so q, k, v may be column slices of one fused QKV buffer. The stats
// are the natural-log log-sum-exp of the scaled scores, [batch, heads, seq] fp32: exactly the
// lse of Device::attention_forward. The backward's fp32 scratch (delta, dQ accumulator) and
// cuDNN's workspace are stream-ordered pool allocations. cuDNN accumulates dQ with atomics, so
// the bf16 backward is not bit-reproducible run to run (the CUDA-core path is).
#pragma once

#include <cudnn_graph.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cudnn_graph.h"

namespace fsdp::cuda {

class CudnnAttention {
 public:
  // Creates the cuDNN handle on the current device; scratch comes from `pool`.
  explicit CudnnAttention(cudaMemPool_t pool);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Raises an Error (naming the shape) when the shape cannot use the fused engines.
  static void check_supported(const kernels::AttentionArgs& a, const void* const* pointers,
                              int count);

  void forward(cudaStream_t stream, const kernels::AttentionArgs& a, const void* q, const void* k,
               const void* v, void* out, float* lse);
  void backward(cudaStream_t stream, const kernels::AttentionArgs& a, const void* q,
                const void* k, const void* v, const void* out, const void* dout,
                const float* lse, void* dq, void* dk, void* dv);

  size_t cached_plans() const { return plans_.size(); }

 private:
  using Key = std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t>;
  const cudnn::Plan& plan_for(bool backward, const kernels::AttentionArgs& a);
  void* scratch(cudaStream_t stream, size_t bytes);

  cudaMemPool_t pool_;
  cudnnHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<cudnn::Plan>> plans_;
};

}  // namespace fsdp::cuda
