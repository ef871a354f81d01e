// RMSNorm forward and backward (Note [Transformer ops]), each optionally fused with the
// residual add around it: the forward can first form h = x + residual (rounded to T, then
// normalized, exactly as add() followed by the plain norm), the backward can add the residual
// path's gradient to dx before its one rounding.
//
// Two kernel shapes. The register kernels take rows of whole 16-byte packs up to
// 2048 * kMaxPacksPerThread columns (every llama-sized model): each thread keeps its packs of the
// row in registers between the reduction and the write, so x and dy are read from memory once,
// and the backward's rows run many blocks at a time. The general kernels take any width (odd
// widths, unaligned views) and re-read the row after the reduction.
//
// Determinism: dw adds per-block partials over a fixed split of the rows (independent of the
// GPU), then the partials of each column in a fixed order.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"
#include "fsdp/error.h"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kMaxPacksPerThread = 4;  // kThreads * kVec * 4 = 8192 columns
// The backward's fixed split of the rows into blocks (fewer when there are fewer rows).
constexpr int64_t kBackwardParts = 512;

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

// Note [Fused amax]: the block's largest |output| as stored into *amax_bits (zeroed before
// the launch), when the caller asked for it. amax_bits is the same for every thread, so the
// block takes the branch (and block_max_bits's barriers) as one.
__device__ __forceinline__ void store_block_amax(unsigned m, unsigned* amax_bits) {
  if (!amax_bits) return;
  m = block_max_bits(m);
  if (threadIdx.x == 0) atomicMax(amax_bits, m);
}

// ---- register kernels: packs q = threadIdx.x + k * kThreads, k < K, of a row of cols / kVec.

template <typename T, int K>
__global__ void __launch_bounds__(kThreads)
    rms_norm_forward_regs(const T* x, const T* residual, const T* w, int64_t rows, int64_t cols,
                          float eps, T* h, T* y, float* rstd, unsigned* amax_bits) {
  const int64_t packs = cols / kVec;
  unsigned m = 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float v[K][kVec];
    float sum_sq = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t q = threadIdx.x + k * kThreads;
      if (q >= packs) continue;
      const int64_t at = r * cols + q * kVec;
      load_pack<kVec>(x + at, v[k]);
      if (residual) {
        float res[kVec];
        load_pack<kVec>(residual + at, res);
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[k][j] = round_to<T>(v[k][j] + res[j]);
        store_pack<kVec>(h + at, v[k]);
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum_sq += v[k][j] * v[k][j];
    }
    sum_sq = block_sum(sum_sq);
    const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(cols) + eps);
    if (threadIdx.x == 0) rstd[r] = inv;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t q = threadIdx.x + k * kThreads;
      if (q >= packs) continue;
      float g[kVec];
      load_pack<kVec>(w + q * kVec, g);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        v[k][j] = v[k][j] * inv * g[j];
        m = max(m, stored_abs_bits<T>(v[k][j]));
      }
      store_pack<kVec>(y + r * cols + q * kVec, v[k]);
    }
  }
  store_block_amax(m, amax_bits);
}

// Block b takes rows [b * rows_per_block, ...) and writes its dw partial to partials[b].
template <typename T, int K>
__global__ void __launch_bounds__(kThreads)
    rms_norm_backward_regs(const T* x, const T* w, const float* rstd, const T* dy,
                           const T* dresidual, int64_t rows, int64_t cols, int64_t rows_per_block,
                           T* dx, float* partials, unsigned* amax_bits) {
  const int64_t packs = cols / kVec;
  unsigned m = 0;
  float wv[K][kVec], acc[K][kVec];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t q = threadIdx.x + k * kThreads;
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[k][j] = 0.0f, wv[k][j] = 0.0f;
    if (q < packs) load_pack<kVec>(w + q * kVec, wv[k]);
  }
  const int64_t r0 = blockIdx.x * rows_per_block;
  const int64_t r1 = std::min(rows, r0 + rows_per_block);
  for (int64_t r = r0; r < r1; ++r) {
    const float inv = rstd[r];
    float xh[K][kVec], dv[K][kVec], res[K][kVec];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t q = threadIdx.x + k * kThreads;
      if (q >= packs) continue;
      load_pack<kVec>(x + r * cols + q * kVec, xh[k]);
      load_pack<kVec>(dy + r * cols + q * kVec, dv[k]);
      // Loaded with x and dy, so its latency is not paid again after the reduction.
      if (dresidual)
        load_pack<kVec>(dresidual + r * cols + q * kVec, res[k]);
      else
#pragma unroll
        for (int j = 0; j < kVec; ++j) res[k][j] = 0.0f;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        xh[k][j] *= inv;
        dot += dv[k][j] * wv[k][j] * xh[k][j];
        acc[k][j] += dv[k][j] * xh[k][j];
      }
    }
    const float mean_gx = block_sum(dot) / static_cast<float>(cols);
    // Each thread writes only the elements it read itself, so dx may alias dy or dresidual.
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t q = threadIdx.x + k * kThreads;
      if (q >= packs) continue;
      float out[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        out[j] = inv * (dv[k][j] * wv[k][j] - xh[k][j] * mean_gx) + res[k][j];
        m = max(m, stored_abs_bits<T>(out[j]));
      }
      store_pack<kVec>(dx + r * cols + q * kVec, out);
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t q = threadIdx.x + k * kThreads;
    if (q < packs) store_pack<kVec>(partials + blockIdx.x * cols + q * kVec, acc[k]);
  }
  store_block_amax(m, amax_bits);
}

// ---- general kernels: any width; thread ownership of columns: packs of W at tid*W + i*W*threads.

template <typename T, int W>
__global__ void rms_norm_forward_general(const T* x, const T* residual, const T* w, int64_t rows,
                                         int64_t cols, float eps, T* h, T* y, float* rstd,
                                         unsigned* amax_bits) {
  unsigned m = 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float sum_sq = 0.0f;
    for (int64_t c = threadIdx.x * W; c < cols; c += blockDim.x * W) {
      float v[W];
      load_pack<W>(x + r * cols + c, v);
      if (residual) {
        float res[W];
        load_pack<W>(residual + r * cols + c, res);
#pragma unroll
        for (int j = 0; j < W; ++j) v[j] = round_to<T>(v[j] + res[j]);
        store_pack<W>(h + r * cols + c, v);
      }
#pragma unroll
      for (int j = 0; j < W; ++j) sum_sq += v[j] * v[j];
    }
    sum_sq = block_sum(sum_sq);  // its barriers also make this row's h visible to the block
    const float inv = 1.0f / sqrtf(sum_sq / static_cast<float>(cols) + eps);
    if (threadIdx.x == 0) rstd[r] = inv;
    const T* xr = (residual ? h : x) + r * cols;
    for (int64_t c = threadIdx.x * W; c < cols; c += blockDim.x * W) {
      float v[W], g[W];
      load_pack<W>(xr + c, v);
      load_pack<W>(w + c, g);
#pragma unroll
      for (int j = 0; j < W; ++j) {
        v[j] = v[j] * inv * g[j];
        m = max(m, stored_abs_bits<T>(v[j]));
      }
      store_pack<W>(y + r * cols + c, v);
    }
  }
  store_block_amax(m, amax_bits);
}

// dx row by row (xh = x rstd, g = dy w, dx = rstd (g - xh mean_c(g xh)) + dresidual), and the
// block's partial dw = sum over its rows of dy xh in shared memory (each thread owns the same
// columns throughout), written to partials[b].
template <typename T, int W>
__global__ void rms_norm_backward_general(const T* x, const T* w, const float* rstd, const T* dy,
                                          const T* dresidual, int64_t rows, int64_t cols,
                                          int64_t rows_per_block, T* dx, float* partials,
                                          unsigned* amax_bits) {
  extern __shared__ float dw_acc[];
  unsigned m = 0;
  for (int64_t c = threadIdx.x * W; c < cols; c += blockDim.x * W)
#pragma unroll
    for (int j = 0; j < W; ++j) dw_acc[c + j] = 0.0f;
  const int64_t r0 = blockIdx.x * rows_per_block;
  const int64_t r1 = std::min(rows, r0 + rows_per_block);
  for (int64_t r = r0; r < r1; ++r) {
    const float inv = rstd[r];
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    float dot = 0.0f;
    for (int64_t c = threadIdx.x * W; c < cols; c += blockDim.x * W) {
      float xv[W], dv[W], wv[W];
      load_pack<W>(xr + c, xv);
      load_pack<W>(dyr + c, dv);
      load_pack<W>(w + c, wv);
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const float xh = xv[j] * inv;
        dot += dv[j] * wv[j] * xh;
        dw_acc[c + j] += dv[j] * xh;
      }
    }
    // The barrier inside block_sum also orders this row's reads before dx (maybe dy) is written.
    const float mean_gx = block_sum(dot) / static_cast<float>(cols);
    for (int64_t c = threadIdx.x * W; c < cols; c += blockDim.x * W) {
      float xv[W], dv[W], wv[W], res[W], out[W];
      load_pack<W>(xr + c, xv);
      load_pack<W>(dyr + c, dv);
      load_pack<W>(w + c, wv);
      if (dresidual)
        load_pack<W>(dresidual + r * cols + c, res);
      else
#pragma unroll
        for (int j = 0; j < W; ++j) res[j] = 0.0f;
#pragma unroll
      for (int j = 0; j < W; ++j) {
        out[j] = inv * (dv[j] * wv[j] - xv[j] * inv * mean_gx) + res[j];
        m = max(m, stored_abs_bits<T>(out[j]));
      }
      store_pack<W>(dx + r * cols + c, out);
    }
  }
  for (int64_t c = threadIdx.x * W; c < cols; c += blockDim.x * W)
#pragma unroll
    for (int j = 0; j < W; ++j) partials[blockIdx.x * cols + c + j] = dw_acc[c + j];
  store_block_amax(m, amax_bits);
}

// dw[c] = sum of the partials in a fixed order: a block of 32 columns x 8 lanes; lane l adds
// the parts l, l + 8, ... in order, then the 8 lane sums are added in lane order.
constexpr int kSumCols = 32, kSumLanes = 8;
template <typename T>
__global__ void sum_partials_by_column_kernel(const float* partials, int64_t parts, int64_t cols,
                                              T* dw) {
  __shared__ float lane_sums[kSumLanes][kSumCols];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumCols + threadIdx.x;
  float acc = 0.0f;
  if (c < cols)
    for (int64_t p = threadIdx.y; p < parts; p += kSumLanes) acc += partials[p * cols + c];
  lane_sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
#pragma unroll
    for (int l = 0; l < kSumLanes; ++l) total += lane_sums[l][threadIdx.x];
    dw[c] = from_float<T>(total);
  }
}

int packs_per_thread(int64_t cols, bool packs) {
  if (!packs) return 0;
  const int64_t per_thread = (cols / kVec + kThreads - 1) / kThreads;
  if (per_thread <= 1) return 1;
  if (per_thread <= 2) return 2;
  if (per_thread <= kMaxPacksPerThread) return kMaxPacksPerThread;
  return 0;  // too wide for the register kernels
}

int grid_for_rows(int64_t rows) {
  return static_cast<int>(std::min<int64_t>(rows, int64_t{1} << 20));
}

template <typename T, int K>
void launch_backward_regs(cudaStream_t stream, int parts, const T* x, const T* w,
                          const float* rstd, const T* dy, const T* dres, int64_t rows,
                          int64_t cols, int64_t rows_per_block, T* dx, float* partials,
                          unsigned* amax_bits) {
  rms_norm_backward_regs<T, K><<<parts, kThreads, 0, stream>>>(
      x, w, rstd, dy, dres, rows, cols, rows_per_block, dx, partials, amax_bits);
}

// The amax's buffer zeroed for the kernels' atomic max, as bits (null when not asked for).
unsigned* zeroed_amax_bits(cudaStream_t stream, float* amax) {
  if (amax) FSDP_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  return reinterpret_cast<unsigned*>(amax);
}

}  // namespace

void rms_norm_forward(cudaStream_t stream, const void* x, const void* residual, const void* w,
                      DType t, int64_t rows, int64_t cols, float eps, void* h, void* y,
                      float* rstd, float* amax) {
  unsigned* amax_bits = zeroed_amax_bits(stream, amax);  // an empty output's amax reads 0
  if (rows <= 0 || cols <= 0) return;
  const bool packs = cols % kVec == 0 && aligned16(x) && aligned16(w) && aligned16(y) &&
                     (residual == nullptr || (aligned16(residual) && aligned16(h)));
  const int k = packs_per_thread(cols, packs);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    const auto* rs = static_cast<const T*>(residual);
    const auto* ws = static_cast<const T*>(w);
    auto* hs = static_cast<T*>(h);
    auto* ys = static_cast<T*>(y);
    const int grid = grid_for_rows(rows);
    if (k == 1)
      rms_norm_forward_regs<T, 1>
          <<<grid, kThreads, 0, stream>>>(xs, rs, ws, rows, cols, eps, hs, ys, rstd, amax_bits);
    else if (k == 2)
      rms_norm_forward_regs<T, 2>
          <<<grid, kThreads, 0, stream>>>(xs, rs, ws, rows, cols, eps, hs, ys, rstd, amax_bits);
    else if (k == kMaxPacksPerThread)
      rms_norm_forward_regs<T, kMaxPacksPerThread>
          <<<grid, kThreads, 0, stream>>>(xs, rs, ws, rows, cols, eps, hs, ys, rstd, amax_bits);
    else if (packs)
      rms_norm_forward_general<T, kVec>
          <<<grid, kThreads, 0, stream>>>(xs, rs, ws, rows, cols, eps, hs, ys, rstd, amax_bits);
    else
      rms_norm_forward_general<T, 1>
          <<<grid, kThreads, 0, stream>>>(xs, rs, ws, rows, cols, eps, hs, ys, rstd, amax_bits);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

// The general kernel keeps one fp32 row of dw partials in dynamic shared memory; rows of up
// to kRmsNormMaxCols columns need more than the 48 KB a launch gets without opting in.
template <typename T, int V>
void launch_backward_general(cudaStream_t stream, int grid, size_t smem, const T* x, const T* w,
                             const float* rstd, const T* dy, const T* dres, int64_t rows,
                             int64_t cols, int64_t rows_per_block, T* dx, float* partials,
                             unsigned* amax_bits) {
  FSDP_CUDA_CHECK(cudaFuncSetAttribute(rms_norm_backward_general<T, V>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  rms_norm_backward_general<T, V><<<grid, kThreads, smem, stream>>>(
      x, w, rstd, dy, dres, rows, cols, rows_per_block, dx, partials, amax_bits);
}

void rms_norm_backward(cudaStream_t stream, cudaMemPool_t scratch_pool, const void* x,
                       const void* w, const float* rstd, const void* dy, const void* dresidual,
                       DType t, int64_t rows, int64_t cols, void* dx, void* dw, float* amax) {
  unsigned* amax_bits = zeroed_amax_bits(stream, amax);
  if (cols <= 0) return;
  if (rows <= 0) {
    fill(stream, dw, t, cols, 0.0f);
    return;
  }
  const bool packs = cols % kVec == 0 && aligned16(x) && aligned16(w) && aligned16(dy) &&
                     aligned16(dx) && (dresidual == nullptr || aligned16(dresidual));
  const int k = packs_per_thread(cols, packs);
  FSDP_CHECK(k > 0 || cols <= kRmsNormMaxCols, "rms_norm_backward: rows of ", cols,
             " columns are wider than the ", kRmsNormMaxCols, " this kernel handles");
  const int64_t rows_per_block = (rows + kBackwardParts - 1) / kBackwardParts;
  const int64_t parts = (rows + rows_per_block - 1) / rows_per_block;
  PoolScratch scratch(stream, scratch_pool);
  float* partials = scratch.get<float>(static_cast<size_t>(parts * cols));
  const size_t smem = static_cast<size_t>(cols) * sizeof(float);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const auto* xs = static_cast<const T*>(x);
    const auto* ws = static_cast<const T*>(w);
    const auto* dys = static_cast<const T*>(dy);
    const auto* dres = static_cast<const T*>(dresidual);
    auto* dxs = static_cast<T*>(dx);
    const int grid = static_cast<int>(parts);
    if (k == 1)
      launch_backward_regs<T, 1>(stream, grid, xs, ws, rstd, dys, dres, rows, cols,
                                 rows_per_block, dxs, partials, amax_bits);
    else if (k == 2)
      launch_backward_regs<T, 2>(stream, grid, xs, ws, rstd, dys, dres, rows, cols,
                                 rows_per_block, dxs, partials, amax_bits);
    else if (k == kMaxPacksPerThread)
      launch_backward_regs<T, kMaxPacksPerThread>(stream, grid, xs, ws, rstd, dys, dres, rows,
                                                  cols, rows_per_block, dxs, partials, amax_bits);
    else if (packs)
      launch_backward_general<T, kVec>(stream, grid, smem, xs, ws, rstd, dys, dres, rows, cols,
                                       rows_per_block, dxs, partials, amax_bits);
    else
      launch_backward_general<T, 1>(stream, grid, smem, xs, ws, rstd, dys, dres, rows, cols,
                                    rows_per_block, dxs, partials, amax_bits);
    FSDP_CUDA_CHECK_LAUNCH();
    const int sum_blocks = static_cast<int>((cols + kSumCols - 1) / kSumCols);
    sum_partials_by_column_kernel<<<sum_blocks, dim3(kSumCols, kSumLanes), 0, stream>>>(
        partials, parts, cols, static_cast<T*>(dw));
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
