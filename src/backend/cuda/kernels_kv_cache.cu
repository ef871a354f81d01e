// Device::attention_kv_cache (Note [KV cache] in fsdp/device.h): the new rows' keys and values
// are copied into the dense caches, then each (new row, head) is one block that walks the
// cached keys [0, position + row] in tiles of kTile, one key per thread: the thread's score is
// a dot product of head_dim in fp32, the block keeps an online softmax (running max and sum,
// the accumulator rescaled when the max grows) and each thread owns head_dim / kTile output
// columns. Decoding reads the whole cache once per token, so the kernel is bound by that read;
// it is written for clarity, not tuned. No atomics: the result does not depend on timing.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kTile = 128;  // keys per tile = threads per block
constexpr int kColsPerThread = static_cast<int>(kKvCacheMaxHeadDim) / kTile;

template <typename T>
__global__ void kv_cache_append_kernel(const T* k, int64_t ldk, const T* v, int64_t ldv,
                                       T* k_cache, T* v_cache, int64_t rows, int64_t width,
                                       int64_t position) {
  const int64_t n = rows * width;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    const int64_t r = e / width, c = e % width;
    k_cache[(position + r) * width + c] = k[r * ldk + c];
    v_cache[(position + r) * width + c] = v[r * ldv + c];
  }
}

// The block's max, or sum, of one value per thread; every thread gets it.
__device__ float block_reduce(float x, float* scratch, bool sum) {
  scratch[threadIdx.x] = x;
  __syncthreads();
  for (int half = kTile / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float o = scratch[threadIdx.x + half];
      scratch[threadIdx.x] = sum ? scratch[threadIdx.x] + o : fmaxf(scratch[threadIdx.x], o);
    }
    __syncthreads();
  }
  const float r = scratch[0];
  __syncthreads();
  return r;
}

template <typename T>
__global__ void __launch_bounds__(kTile)
    kv_cache_attention_kernel(const T* q, int64_t ldq, const T* k_cache, const T* v_cache,
                              T* out, int64_t ldo, int64_t position, int64_t heads,
                              int64_t kv_heads, int64_t hd, float scale) {
  __shared__ float qs[kKvCacheMaxHeadDim];
  __shared__ float p[kTile];
  __shared__ float scratch[kTile];
  const int64_t row = blockIdx.x / heads, h = blockIdx.x % heads;
  const int64_t kvh = h / (heads / kv_heads), width = kv_heads * hd;
  const int64_t keys = position + row + 1;
  for (int64_t c = threadIdx.x; c < hd; c += kTile) qs[c] = to_float(q[row * ldq + h * hd + c]);
  __syncthreads();
  float acc[kColsPerThread];
#pragma unroll
  for (int u = 0; u < kColsPerThread; ++u) acc[u] = 0.0f;
  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t j0 = 0; j0 < keys; j0 += kTile) {
    const int64_t j = j0 + threadIdx.x;
    float s = -INFINITY;
    if (j < keys) {
      const T* kj = k_cache + j * width + kvh * hd;
      float dot = 0.0f;
      for (int64_t c = 0; c < hd; ++c) dot += qs[c] * to_float(kj[c]);
      s = dot * scale;
    }
    const float new_max = fmaxf(running_max, block_reduce(s, scratch, false));
    const float pj = j < keys ? expf(s - new_max) : 0.0f;
    p[threadIdx.x] = pj;
    const float tile_sum = block_reduce(pj, scratch, true);  // its barrier also publishes p
    const float rescale = running_max == -INFINITY ? 0.0f : expf(running_max - new_max);
    running_sum = running_sum * rescale + tile_sum;
    running_max = new_max;
    const int64_t in_tile = keys - j0 < kTile ? keys - j0 : kTile;
#pragma unroll
    for (int u = 0; u < kColsPerThread; ++u) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(u) * kTile;
      if (c >= hd) continue;
      float a = acc[u] * rescale;
      for (int64_t t = 0; t < in_tile; ++t)
        a += p[t] * to_float(v_cache[(j0 + t) * width + kvh * hd + c]);
      acc[u] = a;
    }
    __syncthreads();  // p is rewritten by the next tile
  }
#pragma unroll
  for (int u = 0; u < kColsPerThread; ++u) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(u) * kTile;
    if (c < hd) out[row * ldo + h * hd + c] = from_float<T>(acc[u] / running_sum);
  }
}

}  // namespace

void attention_kv_cache(cudaStream_t stream, DType t, const void* q, int64_t ldq, const void* k,
                        int64_t ldk, const void* v, int64_t ldv, int64_t rows, int64_t position,
                        int64_t heads, int64_t kv_heads, int64_t head_dim, void* k_cache,
                        void* v_cache, void* out, int64_t ldo) {
  if (rows <= 0) return;
  const int64_t width = kv_heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    auto* kc = static_cast<T*>(k_cache);
    auto* vc = static_cast<T*>(v_cache);
    kv_cache_append_kernel<T><<<blocks_for(rows * width), kThreads, 0, stream>>>(
        static_cast<const T*>(k), ldk, static_cast<const T*>(v), ldv, kc, vc, rows, width,
        position);
    const int64_t blocks = rows * heads;
    kv_cache_attention_kernel<T><<<static_cast<unsigned>(blocks), kTile, 0, stream>>>(
        static_cast<const T*>(q), ldq, kc, vc, static_cast<T*>(out), ldo, position, heads,
        kv_heads, head_dim, scale);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
