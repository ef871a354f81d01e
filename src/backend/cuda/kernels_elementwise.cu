// Elementwise kernels: fill, cast, accumulate, activations, add, and the spin kernel.
// Each is one grid-stride launch with 8-element packs (16-byte bf16 accesses) where every
// pointer is pack-aligned, which holds for whole allocations from the pool.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"
#include "fsdp/synthetic.h"

namespace fsdp::cuda::kernels {
namespace {

template <typename T>
struct FillBody {
  T* dst;
  float value;
  template <int W>
  __device__ void run(int64_t i) const {
    float v[W];
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = value;
    store_pack<W>(dst + i, v);
  }
};

template <typename DstT, typename SrcT>
struct CastBody {
  DstT* dst;
  const SrcT* src;
  template <int W>
  __device__ void run(int64_t i) const {
    float v[W];
    load_pack<W>(src + i, v);
    store_pack<W>(dst + i, v);
  }
};

template <typename SrcT>
struct AccumulateBody {
  float* dst;
  const SrcT* src;
  float scale;
  template <int W>
  __device__ void run(int64_t i) const {
    float acc[W], v[W];
    load_pack<W>(dst + i, acc);
    load_pack<W>(src + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) acc[j] += scale * v[j];
    store_pack<W>(dst + i, acc);
  }
};

template <typename T>
struct ScaleBody {
  T* x;
  float factor;
  template <int W>
  __device__ void run(int64_t i) const {
    float v[W];
    load_pack<W>(x + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] *= factor;
    store_pack<W>(x + i, v);
  }
};

// GELU, tanh approximation: y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float activate(Activation f, float x) {
  if (f == Activation::ReLU) return x > 0.0f ? x : 0.0f;
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

// dy/dx of the above; for GELU the exact derivative of the tanh form:
// 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx, du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
__device__ __forceinline__ float activation_slope(Activation f, float x) {
  if (f == Activation::ReLU) return x > 0.0f ? 1.0f : 0.0f;
  const float th = tanhf(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du_dx;
}

template <typename T>
struct ActivationForwardBody {
  const T* x;
  T* y;
  Activation f;
  template <int W>
  __device__ void run(int64_t i) const {
    float v[W];
    load_pack<W>(x + i, v);
#pragma unroll
    for (int j = 0; j < W; ++j) v[j] = activate(f, v[j]);
    store_pack<W>(y + i, v);
  }
};

template <typename T>
struct ActivationBackwardBody {
  const T* x;
  const T* dy;
  T* dx;
  Activation f;
  template <int W>
  __device__ void run(int64_t i) const {
    float xv[W], g[W];
    load_pack<W>(x + i, xv);
    load_pack<W>(dy + i, g);
#pragma unroll
    for (int j = 0; j < W; ++j) g[j] *= activation_slope(f, xv[j]);
    store_pack<W>(dx + i, g);
  }
};

template <typename T>
struct AddBody {
  T* out;
  const T* a;
  const T* b;
  template <int W>
  __device__ void run(int64_t i) const {
    float x[W], y[W];
    load_pack<W>(a + i, x);
    load_pack<W>(b + i, y);
#pragma unroll
    for (int j = 0; j < W; ++j) x[j] += y[j];
    store_pack<W>(out + i, x);
  }
};

// One thread watching the global nanosecond timer: the duration does not depend on the clock
// rate, so tests get the op length they asked for.
__global__ void spin_kernel(uint64_t nanoseconds) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

// Element (r, c) is synthetic_uniform(row seed of first_row + r, c): a pure function of its
// coordinates (double math, as on the host), so every thread computes its own.
template <typename T>
__global__ void synthetic_batch_kernel(T* dst, int64_t rows, int64_t cols, uint64_t seed,
                                       int64_t step, int64_t first_row, float bound) {
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t r = i / cols, c = i - r * cols;
    const uint64_t row_seed = synthetic_row_seed(seed, step, first_row + r);
    dst[i] = from_float<T>(synthetic_uniform(row_seed, static_cast<uint64_t>(c), bound));
  }
}

// One thread per row (Device::synthetic_labels).
__global__ void synthetic_labels_kernel(int32_t* labels, int64_t rows, int64_t width,
                                        uint64_t seed, int64_t step, int64_t first_row,
                                        float bound) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += stride)
    labels[r] = synthetic_label(synthetic_row_seed(seed, step, first_row + r), width, bound);
}

}  // namespace

void synthetic_labels(cudaStream_t stream, int32_t* labels, int64_t rows, int64_t width,
                      uint64_t seed, int64_t step, int64_t first_row, float bound) {
  if (rows <= 0) return;
  synthetic_labels_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(labels, rows, width, seed,
                                                                     step, first_row, bound);
  FSDP_CUDA_CHECK_LAUNCH();
}

void synthetic_batch(cudaStream_t stream, void* dst, DType t, int64_t rows, int64_t cols,
                     uint64_t seed, int64_t step, int64_t first_row, float bound) {
  if (rows <= 0 || cols <= 0) return;
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    synthetic_batch_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(
        static_cast<T*>(dst), rows, cols, seed, step, first_row, bound);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void fill(cudaStream_t stream, void* dst, DType t, int64_t n, float value) {
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(dst);
    launch_elementwise(stream, n, aligned_for_packs(d), FillBody<T>{d, value});
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void cast(cudaStream_t stream, void* dst, DType dst_t, const void* src, DType src_t, int64_t n) {
  dispatch_dtype(dst_t, [&](auto dst_tag) {
    dispatch_dtype(src_t, [&](auto src_tag) {
      using DstT = decltype(dst_tag);
      using SrcT = decltype(src_tag);
      const CastBody<DstT, SrcT> body{static_cast<DstT*>(dst), static_cast<const SrcT*>(src)};
      launch_elementwise(stream, n, aligned_for_packs(body.dst) && aligned_for_packs(body.src),
                         body);
    });
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void accumulate(cudaStream_t stream, float* dst, const void* src, DType src_t, int64_t n,
                float scale) {
  dispatch_dtype(src_t, [&](auto tag) {
    using SrcT = decltype(tag);
    const AccumulateBody<SrcT> body{dst, static_cast<const SrcT*>(src), scale};
    launch_elementwise(stream, n, aligned_for_packs(dst) && aligned_for_packs(body.src), body);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void scale_in_place(cudaStream_t stream, void* x, DType t, int64_t n, float factor) {
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(x);
    launch_elementwise(stream, n, aligned_for_packs(p), ScaleBody<T>{p, factor});
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void activation_forward(cudaStream_t stream, Activation f, const void* x, void* y, DType t,
                        int64_t n) {
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const ActivationForwardBody<T> body{static_cast<const T*>(x), static_cast<T*>(y), f};
    launch_elementwise(stream, n, aligned_for_packs(body.x) && aligned_for_packs(body.y), body);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void activation_backward(cudaStream_t stream, Activation f, const void* x, const void* dy, void* dx,
                         DType t, int64_t n) {
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const ActivationBackwardBody<T> body{static_cast<const T*>(x), static_cast<const T*>(dy),
                                         static_cast<T*>(dx), f};
    const bool vectorized =
        aligned_for_packs(body.x) && aligned_for_packs(body.dy) && aligned_for_packs(body.dx);
    launch_elementwise(stream, n, vectorized, body);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void add(cudaStream_t stream, void* out, const void* a, const void* b, DType t, int64_t n) {
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const AddBody<T> body{static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b)};
    const bool vectorized =
        aligned_for_packs(body.out) && aligned_for_packs(body.a) && aligned_for_packs(body.b);
    launch_elementwise(stream, n, vectorized, body);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void spin(cudaStream_t stream, uint64_t nanoseconds) {
  spin_kernel<<<1, 1, 0, stream>>>(nanoseconds);
  FSDP_CUDA_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
