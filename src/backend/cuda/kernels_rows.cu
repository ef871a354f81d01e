// Row-wise kernels (softmax and its backward, row scaling, row dot products) and the mean-square
// loss (cross-entropy is in kernels_cross_entropy.cu).
// Row kernels give each row to one block (grid-stride over rows) and reduce with
// block_reduce, in fp32 whatever the storage type. The loss reduces in two passes, block
// partials and then one block over the partials, so the loss is bit-for-bit reproducible.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

int blocks_for_rows(int64_t rows) {
  return static_cast<int>(std::clamp<int64_t>(rows, 1, kMaxBlocks));
}

template <typename T>
__global__ void softmax_rows_kernel(const T* x, float* probs, int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    float* pr = probs + r * cols;
    float row_max = -INFINITY;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      row_max = fmaxf(row_max, to_float(xr[c]));
    row_max = block_max(row_max);
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float e = expf(to_float(xr[c]) - row_max);
      pr[c] = e;  // normalized below by the same thread
      sum += e;
    }
    const float inv_sum = 1.0f / block_sum(sum);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) pr[c] *= inv_sum;
  }
}

template <typename T>
__global__ void softmax_rows_backward_kernel(const float* probs, const float* dprobs, T* dx,
                                             int64_t rows, int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* p = probs + r * cols;
    const float* dp = dprobs + r * cols;
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dot += p[c] * dp[c];
    dot = block_sum(dot);  // barrier: every read of the row is done before dx (maybe dp) is written
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      dx[r * cols + c] = from_float<T>(p[c] * (dp[c] - dot));
  }
}

template <typename T>
__global__ void scale_rows_kernel(T* out, const T* in, const float* w, int64_t w_stride,
                                  int64_t rows, int64_t cols, bool accumulate) {
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float scaled = w[(i / cols) * w_stride] * to_float(in[i]);
    out[i] = from_float<T>(accumulate ? to_float(out[i]) + scaled : scaled);
  }
}

template <typename T>
__global__ void row_dot_kernel(const T* a, const T* b, float* out, int64_t out_stride, int64_t rows,
                               int64_t cols) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float sum = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      sum += to_float(a[r * cols + c]) * to_float(b[r * cols + c]);
    sum = block_sum(sum);
    if (threadIdx.x == 0) out[r * out_stride] = sum;
  }
}

// Pass 1 of the mean-square loss: dy = 2y/n (skipped when dy is null: loss only) and one
// partial sum of y^2 per block.
template <typename T>
__global__ void mean_square_partials_kernel(const T* y, int64_t n, T* dy, float* partials) {
  const float two_over_n = 2.0f / static_cast<float>(n);
  float sum = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float v = to_float(y[i]);
    sum += v * v;
    if (dy) dy[i] = from_float<T>(two_over_n * v);
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// Pass 2 of the mean-square loss: one block adds the partials in a fixed order.
__global__ void sum_partials_kernel(const float* partials, int64_t count, float divisor,
                                    float* result) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = block_sum(sum);
  if (threadIdx.x == 0) *result = sum / divisor;
}

// Scratch for the partials, stream-ordered from the pool: no sync, freed right after pass 2.
float* scratch_floats(cudaStream_t stream, cudaMemPool_t pool, int64_t count) {
  void* p = nullptr;
  FSDP_CUDA_CHECK(
      cudaMallocFromPoolAsync(&p, static_cast<size_t>(count) * sizeof(float), pool, stream));
  return static_cast<float*>(p);
}

}  // namespace

void softmax_rows(cudaStream_t stream, const void* x, DType t, float* probs, int64_t rows,
                  int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    softmax_rows_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(static_cast<const T*>(x),
                                                                        probs, rows, cols);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void softmax_rows_backward(cudaStream_t stream, const float* probs, const float* dprobs, void* dx,
                           DType t, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    softmax_rows_backward_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(
        probs, dprobs, static_cast<T*>(dx), rows, cols);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void scale_rows(cudaStream_t stream, void* out, const void* in, DType t, const float* w,
                int64_t w_stride, int64_t rows, int64_t cols, bool accumulate) {
  if (rows <= 0 || cols <= 0) return;
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    scale_rows_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(in), w, w_stride, rows, cols, accumulate);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void row_dot(cudaStream_t stream, const void* a, const void* b, DType t, float* out,
             int64_t out_stride, int64_t rows, int64_t cols) {
  if (rows <= 0) return;
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    row_dot_kernel<<<blocks_for_rows(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), out, out_stride, rows, cols);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void mean_square_loss(cudaStream_t stream, cudaMemPool_t scratch_pool, const void* y, DType t,
                      int64_t n, float* loss, void* dy) {
  if (n <= 0) {
    FSDP_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(float), stream));
    return;
  }
  const int blocks = blocks_for(n);
  float* partials = scratch_floats(stream, scratch_pool, blocks);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    mean_square_partials_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(y), n,
                                                                 static_cast<T*>(dy), partials);
  });
  FSDP_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, static_cast<float>(n), loss);
  FSDP_CUDA_CHECK_LAUNCH();
  FSDP_CUDA_CHECK(cudaFreeAsync(partials, stream));
}

}  // namespace fsdp::cuda::kernels
