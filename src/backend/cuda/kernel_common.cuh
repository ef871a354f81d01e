// Device-side helpers shared by the kernel files: element conversion, packed (vectorized)
// loads and stores, block reductions, launch sizing and dtype dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "fsdp/dtype.h"

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
template <typename F>
void dispatch_dtype(DType t, F&& f) {
  if (t == DType::F32)
    f(float{});
  else
    f(bf16{});
}

template <typename T>
bool aligned_for_packs(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kVec) == 0;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) { return __bfloat162float(x); }

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

// W consecutive elements, aligned to their total size so the compiler emits wide accesses.
template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

template <int W, typename T>
__device__ __forceinline__ void load_pack(const T* p, float (&out)[W]) {
  const Pack<T, W> pack = *reinterpret_cast<const Pack<T, W>*>(p);
#pragma unroll
  for (int i = 0; i < W; ++i) out[i] = to_float(pack.v[i]);
}

template <int W, typename T>
__device__ __forceinline__ void store_pack(T* p, const float (&in)[W]) {
  Pack<T, W> pack;
#pragma unroll
  for (int i = 0; i < W; ++i) pack.v[i] = from_float<T>(in[i]);
  *reinterpret_cast<Pack<T, W>*>(p) = pack;
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
__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

}  // namespace fsdp::cuda::kernels
