// The transformer's fused row kernels (Note [Transformer ops]): embedding forward/backward,
// RoPE and SwiGLU (RMSNorm: kernels_rms_norm.cu). Storage is fp32 or bf16, all math is fp32,
// and every output element is rounded to its dtype once, as on the CPU backend. Whole 16-byte
// packs (8 elements) move where the shape and the pointers allow, single elements otherwise.
//
// Determinism: nothing here uses floating-point atomics. The embedding backward sorts the token
// ids (a stable radix sort, so rows with the same id keep their order) and each vocab row adds
// its dy rows in row order.
#include <cub/device/device_radix_sort.cuh>

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"
#include "fsdp/error.h"

namespace fsdp::cuda::kernels {
namespace {

int grid_for_rows(int64_t rows) {
  return static_cast<int>(std::clamp<int64_t>(rows, 1, kMaxBlocks));
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// ---- embedding

template <typename T>
__global__ void embedding_forward_kernel(const T* table, const int32_t* ids, int64_t rows,
                                         int64_t dim, T* out, bool packs) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* src = table + static_cast<int64_t>(ids[r]) * dim;
    T* dst = out + r * dim;
    if (packs) {
      for (int64_t c = threadIdx.x * kVec; c < dim; c += blockDim.x * kVec)
        copy_pack<kVec>(dst + c, src + c);
    } else {
      for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) dst[c] = src[c];
    }
  }
}

__global__ void iota_kernel(int32_t* v, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    v[i] = static_cast<int32_t>(i);
}

// First position p in sorted[0, n) with sorted[p] >= value.
__device__ int64_t lower_bound(const int32_t* sorted, int64_t n, int64_t value) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(sorted[mid]) < value)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// starts[v] = the first position of id >= v in the sorted ids, for v in [0, vocab]: vocab row v's
// tokens are sorted positions [starts[v], starts[v + 1]). One thread per v, so the binary
// searches' dependent loads overlap instead of running one after another in each block.
__global__ void run_starts_kernel(const int32_t* sorted_ids, int64_t rows, int64_t vocab,
                                  int32_t* starts) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v <= vocab;
       v += stride)
    starts[v] = static_cast<int32_t>(lower_bound(sorted_ids, rows, v));
}

// One vocab row per block (grid-stride): its rows are the run of `v` in the sorted ids, added in
// row order in fp32. Rows no token maps to become 0; ids outside [0, vocab) match no row.
template <typename T, int W>
__global__ void embedding_backward_kernel(const T* dy, const int32_t* starts,
                                          const int32_t* sorted_rows, int64_t dim, int64_t vocab,
                                          T* dtable) {
  for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
    const int64_t lo = starts[v], hi = starts[v + 1];
    T* dst = dtable + v * dim;
    for (int64_t c = threadIdx.x * W; c < dim; c += blockDim.x * W) {
      float acc[W], part[W];
#pragma unroll
      for (int j = 0; j < W; ++j) acc[j] = 0.0f;
      for (int64_t p = lo; p < hi; ++p) {
        load_pack<W>(dy + static_cast<int64_t>(sorted_rows[p]) * dim + c, part);
#pragma unroll
        for (int j = 0; j < W; ++j) acc[j] += part[j];
      }
      store_pack<W>(dst + c, acc);
    }
  }
}

// ---- RoPE: item = (row, group of kRopeHeads heads, pack of W pair indices i < half). The
// angles depend on (row, i) only, so each item computes its W sines and cosines once and
// rotates the pack in each head of its group, all loads in flight before the math.

constexpr int kRopeHeads = 4;

template <typename T, int W>
__global__ void rope_kernel(T* x, int64_t ld, int64_t rows, int64_t heads, int64_t half,
                            int64_t seq_len, int64_t first_position, RopeFreqs freqs,
                            bool inverse) {
  const int64_t packs_per_head = half / W;
  const int64_t groups = (heads + kRopeHeads - 1) / kRopeHeads;
  const int64_t n = rows * groups * packs_per_head;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < n;
       item += stride) {
    const int64_t i0 = (item % packs_per_head) * W;
    const int64_t row_group = item / packs_per_head;
    const int64_t h0 = (row_group % groups) * kRopeHeads, r = row_group / groups;
    const float pos = static_cast<float>(first_position + r % seq_len);
    float c[W], sn[W];
#pragma unroll
    for (int j = 0; j < W; ++j) {
      sincosf(pos * freqs.inv_freq[i0 + j], &sn[j], &c[j]);
      if (inverse) sn[j] = -sn[j];
    }
    float a[kRopeHeads][W], b[kRopeHeads][W];
#pragma unroll
    for (int u = 0; u < kRopeHeads; ++u) {
      if (h0 + u >= heads) continue;
      const T* base = x + r * ld + (h0 + u) * 2 * half;
      load_pack<W>(base + i0, a[u]);
      load_pack<W>(base + i0 + half, b[u]);
    }
#pragma unroll
    for (int u = 0; u < kRopeHeads; ++u) {
      if (h0 + u >= heads) continue;
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const float na = a[u][j] * c[j] - b[u][j] * sn[j], nb = b[u][j] * c[j] + a[u][j] * sn[j];
        a[u][j] = na;
        b[u][j] = nb;
      }
      T* base = x + r * ld + (h0 + u) * 2 * half;
      store_pack<W>(base + i0, a[u]);
      store_pack<W>(base + i0 + half, b[u]);
    }
  }
}

// ---- SwiGLU: element i = r * ffn + c of out; gate h[r, c], up h[r, ffn + c].

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

template <typename T>
struct SwigluForwardBody {
  const T* h;
  T* out;
  int64_t ffn;
  // The largest |value| written, as stored (Note [Fused amax]); run drops it (dead code).
  template <int W>
  __device__ unsigned run_amax(int64_t i) const {
    const int64_t r = i / ffn, c = i % ffn;
    float g[W], u[W];
    load_pack<W>(h + r * 2 * ffn + c, g);
    load_pack<W>(h + r * 2 * ffn + ffn + c, u);
    unsigned m = 0;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      g[j] = g[j] * sigmoid(g[j]) * u[j];
      m = max(m, stored_abs_bits<T>(g[j]));
    }
    store_pack<W>(out + i, g);
    return m;
  }
  template <int W>
  __device__ void run(int64_t i) const {
    run_amax<W>(i);
  }
};

// d gate = dout up sig(g) (1 + g (1 - sig(g))), d up = dout silu(g).
template <typename T>
struct SwigluBackwardBody {
  const T* h;
  const T* dout;
  T* dh;
  int64_t ffn;
  template <int W>
  __device__ unsigned run_amax(int64_t i) const {
    const int64_t r = i / ffn, c = i % ffn;
    float g[W], u[W], d[W], dg[W], du[W];
    load_pack<W>(h + r * 2 * ffn + c, g);
    load_pack<W>(h + r * 2 * ffn + ffn + c, u);
    load_pack<W>(dout + i, d);
    unsigned m = 0;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float sg = sigmoid(g[j]);
      dg[j] = d[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
      du[j] = d[j] * g[j] * sg;
      m = max(m, max(stored_abs_bits<T>(dg[j]), stored_abs_bits<T>(du[j])));
    }
    store_pack<W>(dh + r * 2 * ffn + c, dg);
    store_pack<W>(dh + r * 2 * ffn + ffn + c, du);
    return m;
  }
  template <int W>
  __device__ void run(int64_t i) const {
    run_amax<W>(i);
  }
};

}  // namespace

void embedding_forward(cudaStream_t stream, const void* table, DType t, const int32_t* ids,
                       int64_t rows, int64_t dim, void* out) {
  if (rows <= 0 || dim <= 0) return;
  const bool packs = dim % kVec == 0 && aligned16(table) && aligned16(out);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    embedding_forward_kernel<<<grid_for_rows(rows), kThreads, 0, stream>>>(
        static_cast<const T*>(table), ids, rows, dim, static_cast<T*>(out), packs);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void embedding_backward(cudaStream_t stream, cudaMemPool_t scratch_pool, const void* dy, DType t,
                        const int32_t* ids, int64_t rows, int64_t dim, int64_t vocab,
                        void* dtable) {
  if (vocab <= 0 || dim <= 0) return;
  if (rows <= 0) {
    fill(stream, dtable, t, vocab * dim, 0.0f);
    return;
  }
  FSDP_CHECK(rows < (int64_t{1} << 31), "embedding_backward: ", rows,
             " rows do not fit the sort's 32-bit row indices");
  PoolScratch scratch(stream, scratch_pool);
  const auto n = static_cast<size_t>(rows);
  int32_t* rows_in = scratch.get<int32_t>(n);
  int32_t* sorted_ids = scratch.get<int32_t>(n);
  int32_t* sorted_rows = scratch.get<int32_t>(n);
  iota_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(rows_in, rows);
  FSDP_CUDA_CHECK_LAUNCH();
  size_t temp_bytes = 0;
  const int items = static_cast<int>(rows);
  FSDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids, sorted_ids, rows_in,
                                                  sorted_rows, items, 0, 32, stream));
  void* temp = scratch.get<uint8_t>(temp_bytes);
  FSDP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, sorted_ids, rows_in,
                                                  sorted_rows, items, 0, 32, stream));
  int32_t* starts = scratch.get<int32_t>(static_cast<size_t>(vocab) + 1);
  run_starts_kernel<<<blocks_for(vocab + 1), kThreads, 0, stream>>>(sorted_ids, rows, vocab,
                                                                     starts);
  FSDP_CUDA_CHECK_LAUNCH();
  const bool packs = dim % kVec == 0 && aligned16(dy) && aligned16(dtable);
  // A block per vocab row (up to 2^20): most rows have no token and only write zeros.
  const int grid = static_cast<int>(std::min<int64_t>(vocab, int64_t{1} << 20));
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const auto* src = static_cast<const T*>(dy);
    auto* dst = static_cast<T*>(dtable);
    if (packs)
      embedding_backward_kernel<T, kVec><<<grid, kThreads, 0, stream>>>(src, starts, sorted_rows,
                                                                         dim, vocab, dst);
    else
      embedding_backward_kernel<T, 1><<<grid, kThreads, 0, stream>>>(src, starts, sorted_rows,
                                                                      dim, vocab, dst);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void rope(cudaStream_t stream, void* x, int64_t ld, DType t, int64_t rows, int64_t heads,
          int64_t head_dim, int64_t seq_len, int64_t first_position, const RopeFreqs& freqs,
          bool inverse) {
  if (rows <= 0 || heads <= 0) return;
  const int64_t half = head_dim / 2;
  const bool packs = half % kVec == 0 && ld % kVec == 0 && aligned16(x);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    auto* xs = static_cast<T*>(x);
    const int64_t groups = (heads + kRopeHeads - 1) / kRopeHeads;
    if (packs)
      rope_kernel<T, kVec><<<blocks_for(rows * groups * (half / kVec)), kThreads, 0, stream>>>(
          xs, ld, rows, heads, half, seq_len, first_position, freqs, inverse);
    else
      rope_kernel<T, 1><<<blocks_for(rows * groups * half), kThreads, 0, stream>>>(
          xs, ld, rows, heads, half, seq_len, first_position, freqs, inverse);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void swiglu_forward(cudaStream_t stream, const void* h, DType t, int64_t rows, int64_t ffn,
                    void* out, float* amax) {
  if (rows <= 0 || ffn <= 0) rows = 0;  // an amax still reads 0
  const bool packs = ffn % kVec == 0 && aligned16(h) && aligned16(out);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    launch_elementwise_amax(
        stream, rows * ffn, packs,
        SwigluForwardBody<T>{static_cast<const T*>(h), static_cast<T*>(out), ffn}, amax);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(cudaStream_t stream, const void* h, const void* dout, DType t, int64_t rows,
                     int64_t ffn, void* dh, float* amax) {
  if (rows <= 0 || ffn <= 0) rows = 0;  // an amax still reads 0
  const bool packs = ffn % kVec == 0 && aligned16(h) && aligned16(dout) && aligned16(dh);
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    launch_elementwise_amax(stream, rows * ffn, packs,
                            SwigluBackwardBody<T>{static_cast<const T*>(h),
                                                  static_cast<const T*>(dout),
                                                  static_cast<T*>(dh), ffn},
                            amax);
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
