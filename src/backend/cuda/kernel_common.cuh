// Device-side helpers shared by the kernel files: element conversion, packed (vectorized)
// loads and stores, block reductions, launch sizing and dtype dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "fsdp/dtype.h"
#include "fsdp/error.h"

namespace fsdp::cuda::kernels {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
// Grid-stride kernels never need more blocks than a few waves of the biggest GPU; capping the
// grid keeps the per-block setup small for huge tensors.
constexpr int64_t kMaxBlocks = 4096;
// Elements per vector step: 8 bf16 = one 16-byte access, 8 fp32 = two.
constexpr int kVec = 8;

inline int blocks_for(int64_t items, int threads = kThreads) {
  const int64_t blocks = (items + threads - 1) / threads;
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

// Calls f(T{}) with T = float or bf16 according to t, so one generic lambda covers both.
// Any other dtype (I32: token ids) has no float kernel: taken for bf16 it would touch half its
// bytes, so it is an internal error.
template <typename F>
void dispatch_dtype(DType t, F&& f) {
  if (t == DType::F32)
    f(float{});
  else if (t == DType::BF16)
    f(bf16{});
  else
    FSDP_FAIL("a float kernel was given ", dtype_name(t), " data");
}

// A pack of kVec elements starting at an index that is a multiple of kVec is 16-byte aligned
// when the base pointer is.
template <typename T>
bool aligned_for_packs(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(bf16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, like fsdp::float_to_bf16
}

// Packs of W consecutive elements. Whole packs move as 16-byte words (uint4), and stores go
// through __stwb (an ordinary write-back store): written as plain struct or uint4 stores, the
// compiler was seen (nvcc 13, PTX) to split them into 4-byte stores in the multi-tensor
// kernels. W = 1 is the plain scalar access.
template <typename T>
__device__ __forceinline__ uint32_t bits_of(float x) {
  if constexpr (std::is_same_v<T, float>)
    return __float_as_uint(x);
  else
    return __bfloat16_as_ushort(from_float<bf16>(x));
}
template <typename T>
__device__ __forceinline__ float from_bits(uint32_t bits) {
  if constexpr (std::is_same_v<T, float>)
    return __uint_as_float(bits);
  else
    return __uint_as_float(bits << 16);  // bf16 is the top half of an fp32
}

template <typename T, int W>
constexpr bool kWholeWords = (sizeof(T) * W) % 16 == 0;

template <int W, typename T>
__device__ __forceinline__ void load_pack(const T* p, float (&out)[W]) {
  if constexpr (kWholeWords<T, W>) {
    constexpr int kPerWord = 16 / sizeof(T);
#pragma unroll
    for (int w = 0; w < W / kPerWord; ++w) {
      const uint4 word = reinterpret_cast<const uint4*>(p)[w];
      const uint32_t lanes[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
      for (int i = 0; i < kPerWord; ++i) {
        const uint32_t lane = lanes[i * sizeof(T) / 4];
        out[w * kPerWord + i] =
            sizeof(T) == 4 ? from_bits<T>(lane) : from_bits<T>((lane >> (16 * (i & 1))) & 0xffffu);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) out[i] = to_float(p[i]);
  }
}

// kShared: `p` is in shared memory (__stwb, a streaming store, is for global memory).
template <int W, typename T, bool kShared = false>
__device__ __forceinline__ void store_pack(T* p, const float (&in)[W]) {
  if constexpr (kWholeWords<T, W>) {
    constexpr int kPerWord = 16 / sizeof(T);
#pragma unroll
    for (int w = 0; w < W / kPerWord; ++w) {
      uint32_t lanes[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (sizeof(T) == 4)
          lanes[j] = bits_of<T>(in[w * 4 + j]);
        else
          lanes[j] = bits_of<T>(in[w * 8 + 2 * j]) | (bits_of<T>(in[w * 8 + 2 * j + 1]) << 16);
      }
      const uint4 word = make_uint4(lanes[0], lanes[1], lanes[2], lanes[3]);
      if constexpr (kShared)
        reinterpret_cast<uint4*>(p)[w] = word;
      else
        __stwb(reinterpret_cast<uint4*>(p) + w, word);
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) p[i] = from_float<T>(in[i]);
  }
}

// Moves W elements unchanged.
template <int W, typename T>
__device__ __forceinline__ void copy_pack(T* dst, const T* src) {
  if constexpr (kWholeWords<T, W>) {
#pragma unroll
    for (int w = 0; w < static_cast<int>(sizeof(T) * W / 16); ++w)
      __stwb(reinterpret_cast<uint4*>(dst) + w, reinterpret_cast<const uint4*>(src)[w]);
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) dst[i] = src[i];
  }
}

// Runs body.template run<W>(i) over [0, n): packs of kVec where `vectorized` (every pointer the
// body touches is pack-aligned), then single elements for the tail, grid-stride throughout.
template <typename Body>
__global__ void elementwise_kernel(int64_t n, bool vectorized, Body body) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = vectorized ? n / kVec : 0;
  for (int64_t p = first; p < packs; p += stride) body.template run<kVec>(p * kVec);
  for (int64_t i = packs * kVec + first; i < n; i += stride) body.template run<1>(i);
}

template <typename Body>
void launch_elementwise(cudaStream_t stream, int64_t n, bool vectorized, const Body& body) {
  if (n <= 0) return;
  const int64_t items = vectorized ? n / kVec + kVec : n;
  elementwise_kernel<<<blocks_for(items), kThreads, 0, stream>>>(n, vectorized, body);
}

// The block's max of v (unsigned), valid in thread 0 (the fp8 amaxes' magnitudes as bits: an
// integer max orders non-negative floats, and NaN above infinity).
__device__ __forceinline__ unsigned block_max_bits(unsigned v) {
  __shared__ unsigned warp_max[kThreads / 32];
  for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? warp_max[threadIdx.x] : 0u;
    for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// |v| as stored in T (rounded), as its bits: the amax of what a kernel wrote.
template <typename T>
__device__ __forceinline__ unsigned stored_abs_bits(float v) {
  return __float_as_uint(fabsf(to_float(from_float<T>(v))));
}

// Note [Fused amax]: elementwise_kernel whose body's run_amax<W>(i) returns the largest
// stored_abs_bits of what it wrote; the block's max goes to *amax_bits (zeroed before).
template <typename Body>
__global__ void elementwise_amax_kernel(int64_t n, bool vectorized, Body body, unsigned* amax_bits) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = vectorized ? n / kVec : 0;
  unsigned m = 0;
  for (int64_t p = first; p < packs; p += stride) m = max(m, body.template run_amax<kVec>(p * kVec));
  for (int64_t i = packs * kVec + first; i < n; i += stride) m = max(m, body.template run_amax<1>(i));
  m = block_max_bits(m);
  if (threadIdx.x == 0) atomicMax(amax_bits, m);
}

// launch_elementwise, or with amax (not null) the amax variant after zeroing it on the stream.
template <typename Body>
void launch_elementwise_amax(cudaStream_t stream, int64_t n, bool vectorized, const Body& body,
                             float* amax) {
  if (!amax) {
    launch_elementwise(stream, n, vectorized, body);
    return;
  }
  FSDP_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (n <= 0) return;
  const int64_t items = vectorized ? n / kVec + kVec : n;
  elementwise_amax_kernel<<<blocks_for(items), kThreads, 0, stream>>>(
      n, vectorized, body, reinterpret_cast<unsigned*>(amax));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Block-wide sum / max, result returned to every thread. Deterministic for a fixed block size.
// The trailing barrier lets a block call it again right away (the scratch is reused).
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const float identity = kMax ? -INFINITY : 0.0f;
  float total = lane < warps ? partial[lane] : identity;
  total = kMax ? warp_max(total) : warp_sum(total);
  __syncthreads();
  return total;
}
__device__ __forceinline__ float block_sum(float v) {
  return block_reduce<false>(v);
}
__device__ __forceinline__ float block_max(float v) {
  return block_reduce<true>(v);
}

// Stream-ordered scratch from the pool, returned (stream-ordered) when the scope ends, after
// the kernels that use it were enqueued.
class PoolScratch {
 public:
  PoolScratch(cudaStream_t stream, cudaMemPool_t pool) : stream_(stream), pool_(pool) {}
  ~PoolScratch() {
    for (void* p : ptrs_) (void)cudaFreeAsync(p, stream_);
  }
  PoolScratch(const PoolScratch&) = delete;
  PoolScratch& operator=(const PoolScratch&) = delete;
  template <typename T>
  T* get(size_t count) {
    void* p = nullptr;
    FSDP_CUDA_CHECK(cudaMallocFromPoolAsync(&p, count * sizeof(T) + 16, pool_, stream_));
    ptrs_[used_++] = p;
    return static_cast<T*>(p);
  }

 private:
  cudaStream_t stream_;
  cudaMemPool_t pool_;
  void* ptrs_[8] = {};
  int used_ = 0;
};

}  // namespace fsdp::cuda::kernels
