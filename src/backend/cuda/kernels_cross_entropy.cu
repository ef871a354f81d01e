// Device::cross_entropy_loss on CUDA: one read of the logits and one write of dlogits.
//
// The LM head's logits are the largest activation of a transformer step ([tokens, vocab], e.g.
// 8192 x 32000 bf16 = 0.5 GB), so the loss must be bound by that traffic, not by latency. One
// block per row: pass 1 loads the row in 16-byte words, keeps it in shared memory (when it fits)
// and folds each pack into the thread's online softmax state (running max m, sum of exp(x - m));
// the block merges the states; pass 2 reads the row back from shared memory (or again from
// global memory, mostly L2 hits, for rows too wide) and writes dlogits. Row losses are reduced
// by one block in row order, so the loss is bit-for-bit reproducible for a given shape.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kLossThreads = 512;
constexpr int kUnroll = 4;  // packs each thread loads before it reduces them
constexpr float kLog2e = 1.4426950408889634f;
// Rows up to this many bytes are kept in shared memory (two blocks still fit on an SM).
constexpr size_t kMaxCachedRowBytes = 96 * 1024;

// exp(x) for x <= 0 through the hardware exp2: the difference x is formed exactly first, so the
// error is that of one multiply and ex2 (a few fp32 ulps), far below a bf16 ulp.
__device__ __forceinline__ float exp_nonpositive(float x) {
  return exp2f(x * kLog2e);
}

// The online softmax state of a set of values: max m and s = sum exp(v - m).
struct SoftmaxState {
  float m = -INFINITY, s = 0.0f;
  __device__ void merge(float om, float os) {
    const float nm = fmaxf(m, om);
    if (nm == -INFINITY) return;  // both empty (or all -inf): nothing to add
    s = s * exp_nonpositive(m - nm) + os * exp_nonpositive(om - nm);
    m = nm;
  }
};

// Block-wide merge; every thread gets the result. Deterministic for a fixed block size.
__device__ SoftmaxState block_merge(SoftmaxState st) {
  __shared__ float part_m[32], part_s[32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, st.m, offset);
    const float os = __shfl_xor_sync(0xffffffffu, st.s, offset);
    st.merge(om, os);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part_m[warp] = st.m, part_s[warp] = st.s;
  __syncthreads();
  SoftmaxState total;
  const int warps = (blockDim.x + 31) >> 5;
  if (lane < warps) total.m = part_m[lane], total.s = part_s[lane];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, total.m, offset);
    const float os = __shfl_xor_sync(0xffffffffu, total.s, offset);
    total.merge(om, os);
  }
  __syncthreads();  // the scratch may be reused by the next row
  return total;
}

// Packs of W elements: W = kVec when the row length and both pointers allow 16-byte words.
// kCached keeps the row in dynamic shared memory between the passes.
template <typename T, int W, bool kCached>
__global__ void __launch_bounds__(kLossThreads)
    cross_entropy_kernel(const T* logits, const int32_t* labels, int64_t rows, int64_t classes,
                         T* dlogits, float* row_losses) {
  extern __shared__ uint4 row_cache_words[];
  T* row_cache = reinterpret_cast<T*>(row_cache_words);
  const float inv_rows = 1.0f / static_cast<float>(rows);
  const int64_t packs = classes / W;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* x = logits + r * classes;
    SoftmaxState st;
    // kUnroll packs per thread in flight at once; one online-softmax merge per group.
    for (int64_t p0 = threadIdx.x; p0 < packs; p0 += kUnroll * blockDim.x) {
      float v[kUnroll][W];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t p = p0 + u * blockDim.x;
        if (p < packs) {
          load_pack<W>(x + p * W, v[u]);
        } else {
#pragma unroll
          for (int j = 0; j < W; ++j) v[u][j] = -INFINITY;
        }
      }
      float gm = -INFINITY;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t p = p0 + u * blockDim.x;
        if constexpr (kCached)
          if (p < packs)  // exact: v came from T
            store_pack<W, T, /*kShared=*/true>(row_cache + p * W, v[u]);
#pragma unroll
        for (int j = 0; j < W; ++j) gm = fmaxf(gm, v[u][j]);
      }
      float gs = 0.0f;
      if (gm != -INFINITY) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int j = 0; j < W; ++j) gs += exp_nonpositive(v[u][j] - gm);
      }
      st.merge(gm, gs);
    }
    st = block_merge(st);  // its barriers also make the cached row visible to every thread
    const int32_t label = labels[r];
    const bool label_ok = label >= 0 && label < classes;
    const T* src = kCached ? row_cache : x;
    if (threadIdx.x == 0)
      row_losses[r] = label_ok ? st.m + logf(st.s) - to_float(src[label]) : NAN;
    if (dlogits) {  // else: loss only
      // Uncached, x[label] must be read before dlogits (which may alias the logits) is written.
      if constexpr (!kCached) __syncthreads();
      const float inv_sum = 1.0f / st.s;
      T* dx = dlogits + r * classes;
      for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
        float v[W];
        load_pack<W>(src + p * W, v);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float prob = exp_nonpositive(v[j] - st.m) * inv_sum;
          v[j] = (prob - (p * W + j == label ? 1.0f : 0.0f)) * inv_rows;
        }
        store_pack<W>(dx + p * W, v);
      }
    }
    if constexpr (kCached) __syncthreads();  // every read of the cache is done before the next
                                             // row overwrites it
  }
}

// One block adds the row losses in a fixed order.
__global__ void mean_of_rows_kernel(const float* row_losses, int64_t rows, float* loss) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) sum += row_losses[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *loss = sum / static_cast<float>(rows);
}

template <typename T, int W, bool kCached>
void launch_cross_entropy(cudaStream_t stream, const T* logits, const int32_t* labels,
                          int64_t rows, int64_t classes, T* dlogits, float* row_losses) {
  const size_t smem = kCached ? static_cast<size_t>(classes) * sizeof(T) : 0;
  auto kernel = cross_entropy_kernel<T, W, kCached>;
  if (smem > 48 * 1024)  // beyond the default limit a kernel must opt in
    FSDP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  const int grid = static_cast<int>(std::min<int64_t>(rows, int64_t{1} << 20));
  kernel<<<grid, kLossThreads, smem, stream>>>(logits, labels, rows, classes, dlogits,
                                               row_losses);
}

}  // namespace

void cross_entropy_loss(cudaStream_t stream, cudaMemPool_t scratch_pool, const void* logits,
                        DType t, const int32_t* labels, int64_t rows, int64_t classes, float* loss,
                        void* dlogits) {
  if (rows <= 0) {
    FSDP_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(float), stream));
    return;
  }
  float* row_losses = nullptr;
  FSDP_CUDA_CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&row_losses),
                                          static_cast<size_t>(rows) * sizeof(float), scratch_pool,
                                          stream));
  const bool cached = static_cast<size_t>(classes) * dtype_size(t) <= kMaxCachedRowBytes;
  const bool packs = classes % kVec == 0 && aligned_for_packs(logits) &&
                     (dlogits == nullptr || aligned_for_packs(dlogits));
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const auto* x = static_cast<const T*>(logits);
    auto* dx = static_cast<T*>(dlogits);
    if (packs && cached)
      launch_cross_entropy<T, kVec, true>(stream, x, labels, rows, classes, dx, row_losses);
    else if (packs)
      launch_cross_entropy<T, kVec, false>(stream, x, labels, rows, classes, dx, row_losses);
    else if (cached)
      launch_cross_entropy<T, 1, true>(stream, x, labels, rows, classes, dx, row_losses);
    else
      launch_cross_entropy<T, 1, false>(stream, x, labels, rows, classes, dx, row_losses);
  });
  FSDP_CUDA_CHECK_LAUNCH();
  mean_of_rows_kernel<<<1, kThreads, 0, stream>>>(row_losses, rows, loss);
  FSDP_CUDA_CHECK_LAUNCH();
  FSDP_CUDA_CHECK(cudaFreeAsync(row_losses, stream));
}

}  // namespace fsdp::cuda::kernels
