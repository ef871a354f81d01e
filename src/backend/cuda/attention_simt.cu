// Causal grouped-query attention on CUDA cores, flash-style (Note [Transformer ops]): fp32 math
// and accumulation, K/V (or Q/dO) tiles staged in shared memory, the softmax kept online, and no
// T x T buffer. This is the fp32 path (cuDNN's fused attention takes fp16/bf16 only) and, when
// FSDP_ATTENTION=simt asks for it, the bf16 one; cudnn_attention.cpp has the fast bf16 path.
//
// forward:   one thread per query row; per key, s = q.k * scale, online max/sum, acc += p v.
// backward:  delta_i = dout_i . out_i; then one thread per key row accumulates
//            dv_j = sum_i p_ij dout_i and dk_j = sum_i ds_ij q_i over the query rows i >= j of
//            every query head of its group (so GQA needs no atomics), and one thread per query
//            row accumulates dq_i = sum_j ds_ij k_j, with p_ij = exp(s_ij - lse_i) and
//            ds_ij = p_ij (dout_i . v_j - delta_i) * scale. Every sum runs in a fixed order:
//            the results are deterministic.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"
#include "fsdp/error.h"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kRowsPerBlock = 64;  // query rows (forward, dq) or key rows (dk/dv) per block
constexpr int kTile = 64;          // rows of the other side staged per step (forward, dq)
constexpr int kQueryTile = 32;     // query rows staged per step (dk/dv)

// Token r's head h slice starts at base + r * ld + h * D.
template <typename T, int D>
__device__ void stage_rows(float* dst, int dst_ld, const T* src, int64_t ld, int64_t col,
                           int64_t first_token, int64_t first_row, int rows, int64_t seq) {
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int row = idx / D, c = idx % D;
    const int64_t i = first_row + row;
    dst[row * dst_ld + c] =
        i < seq ? to_float(src[(first_token + i) * ld + col + c]) : 0.0f;
  }
}

template <int D>
__device__ __forceinline__ float dot_row(const float* a, const float* b) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < D; ++c) s += a[c] * b[c];
  return s;
}

template <typename T, int D>
__global__ void __launch_bounds__(kRowsPerBlock)
    forward_kernel(AttentionArgs a, const T* q, const T* k, const T* v, T* out, float* lse) {
  extern __shared__ float smem[];
  float* k_s = smem;                                 // [kTile][D]
  float* v_s = k_s + kTile * D;                      // [kTile][D]
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t{blockIdx.x} * kRowsPerBlock;
  const int64_t kvh = h / (a.heads / a.kv_heads), t0 = b * a.seq;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const int64_t i = q0 + threadIdx.x;
  float my_q[D];  // this thread's query row, in registers
#pragma unroll
  for (int c = 0; c < D; ++c)
    my_q[c] = i < a.seq ? to_float(q[(t0 + i) * a.ldq + h * D + c]) : 0.0f;
  float acc[D];
#pragma unroll
  for (int c = 0; c < D; ++c) acc[c] = 0.0f;
  float row_max = -INFINITY, row_sum = 0.0f;
  const int64_t last_key = std::min(a.seq - 1, q0 + kRowsPerBlock - 1);
  for (int64_t j0 = 0; j0 <= last_key; j0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    stage_rows<T, D>(k_s, D, k, a.ldk, kvh * D, t0, j0, kTile, a.seq);
    stage_rows<T, D>(v_s, D, v, a.ldv, kvh * D, t0, j0, kTile, a.seq);
    __syncthreads();
    const int keys = static_cast<int>(std::min<int64_t>(kTile, i - j0 + 1));  // causal: j <= i
    for (int jj = 0; jj < keys; ++jj) {
      const float s = dot_row<D>(my_q, k_s + jj * D) * scale;
      if (s > row_max) {
        const float correction = expf(row_max - s);  // 0 on the first key
        row_sum *= correction;
#pragma unroll
        for (int c = 0; c < D; ++c) acc[c] *= correction;
        row_max = s;
      }
      const float p = expf(s - row_max);
      row_sum += p;
      const float* vj = v_s + jj * D;
#pragma unroll
      for (int c = 0; c < D; ++c) acc[c] += p * vj[c];
    }
  }
  if (i >= a.seq) return;
  const float inv_sum = 1.0f / row_sum;
  T* o = out + (t0 + i) * a.ldo + h * D;
#pragma unroll
  for (int c = 0; c < D; ++c) o[c] = from_float<T>(acc[c] * inv_sum);
  lse[(b * a.heads + h) * a.seq + i] = row_max + logf(row_sum);
}

// delta[(b*heads + h)*seq + i] = dout_i . out_i, one warp per row.
template <typename T>
__global__ void delta_kernel(AttentionArgs a, const T* out, const T* dout, float* delta) {
  const int64_t rows = a.batch * a.heads * a.seq;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < rows;
       w += warps) {
    const int64_t i = w % a.seq, h = (w / a.seq) % a.heads, b = w / (a.seq * a.heads);
    const int64_t t = b * a.seq + i;
    float s = 0.0f;
    for (int64_t c = lane; c < a.head_dim; c += 32)
      s += to_float(dout[t * a.lddo + h * a.head_dim + c]) * to_float(out[t * a.ldo + h * a.head_dim + c]);
    s = warp_sum(s);
    if (lane == 0) delta[w] = s;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kRowsPerBlock)
    dkdv_kernel(AttentionArgs a, const T* q, const T* k, const T* v, const T* dout,
                const float* lse, const float* delta, T* dk, T* dv) {
  extern __shared__ float smem[];
  float* k_s = smem;                                 // [kRowsPerBlock][D + 1]: own rows
  float* v_s = k_s + kRowsPerBlock * (D + 1);        // [kRowsPerBlock][D + 1]
  float* q_s = v_s + kRowsPerBlock * (D + 1);        // [kQueryTile][D]
  float* do_s = q_s + kQueryTile * D;                // [kQueryTile][D]
  float* lse_s = do_s + kQueryTile * D;              // [kQueryTile]
  float* delta_s = lse_s + kQueryTile;               // [kQueryTile]
  const int64_t b = blockIdx.z, kvh = blockIdx.y, j0 = int64_t{blockIdx.x} * kRowsPerBlock;
  const int64_t group = a.heads / a.kv_heads, t0 = b * a.seq;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  stage_rows<T, D>(k_s, D + 1, k, a.ldk, kvh * D, t0, j0, kRowsPerBlock, a.seq);
  stage_rows<T, D>(v_s, D + 1, v, a.ldv, kvh * D, t0, j0, kRowsPerBlock, a.seq);
  const int64_t j = j0 + threadIdx.x;
  const float* my_k = k_s + threadIdx.x * (D + 1);
  const float* my_v = v_s + threadIdx.x * (D + 1);
  float dk_acc[D], dv_acc[D];
#pragma unroll
  for (int c = 0; c < D; ++c) dk_acc[c] = dv_acc[c] = 0.0f;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const float* lse_h = lse + (b * a.heads + h) * a.seq;
    const float* delta_h = delta + (b * a.heads + h) * a.seq;
    for (int64_t i0 = (j0 / kQueryTile) * kQueryTile; i0 < a.seq; i0 += kQueryTile) {
      __syncthreads();
      stage_rows<T, D>(q_s, D, q, a.ldq, h * D, t0, i0, kQueryTile, a.seq);
      stage_rows<T, D>(do_s, D, dout, a.lddo, h * D, t0, i0, kQueryTile, a.seq);
      for (int r = threadIdx.x; r < kQueryTile; r += blockDim.x) {
        const bool valid = i0 + r < a.seq;
        lse_s[r] = valid ? lse_h[i0 + r] : 0.0f;
        delta_s[r] = valid ? delta_h[i0 + r] : 0.0f;
      }
      __syncthreads();
      if (j >= a.seq) continue;
      for (int ii = 0; ii < kQueryTile; ++ii) {
        const int64_t i = i0 + ii;
        if (i < j) continue;  // causal
        if (i >= a.seq) break;
        const float* qi = q_s + ii * D;
        const float* doi = do_s + ii * D;
        const float p = expf(dot_row<D>(qi, my_k) * scale - lse_s[ii]);
        const float ds = p * (dot_row<D>(doi, my_v) - delta_s[ii]) * scale;
#pragma unroll
        for (int c = 0; c < D; ++c) {
          dv_acc[c] += p * doi[c];
          dk_acc[c] += ds * qi[c];
        }
      }
    }
  }
  if (j >= a.seq) return;
  T* dk_row = dk + (t0 + j) * a.ldk + kvh * D;
  T* dv_row = dv + (t0 + j) * a.ldv + kvh * D;
#pragma unroll
  for (int c = 0; c < D; ++c) {
    dk_row[c] = from_float<T>(dk_acc[c]);
    dv_row[c] = from_float<T>(dv_acc[c]);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kRowsPerBlock)
    dq_kernel(AttentionArgs a, const T* q, const T* k, const T* v, const T* dout,
              const float* lse, const float* delta, T* dq) {
  extern __shared__ float smem[];
  float* q_s = smem;                                 // [kRowsPerBlock][D + 1]: own rows
  float* do_s = q_s + kRowsPerBlock * (D + 1);       // [kRowsPerBlock][D + 1]
  float* k_s = do_s + kRowsPerBlock * (D + 1);       // [kTile][D]
  float* v_s = k_s + kTile * D;                      // [kTile][D]
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t{blockIdx.x} * kRowsPerBlock;
  const int64_t kvh = h / (a.heads / a.kv_heads), t0 = b * a.seq;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  stage_rows<T, D>(q_s, D + 1, q, a.ldq, h * D, t0, q0, kRowsPerBlock, a.seq);
  stage_rows<T, D>(do_s, D + 1, dout, a.lddo, h * D, t0, q0, kRowsPerBlock, a.seq);
  const int64_t i = q0 + threadIdx.x;
  const bool valid = i < a.seq;
  const float lse_i = valid ? lse[(b * a.heads + h) * a.seq + i] : 0.0f;
  const float delta_i = valid ? delta[(b * a.heads + h) * a.seq + i] : 0.0f;
  const float* my_q = q_s + threadIdx.x * (D + 1);
  const float* my_do = do_s + threadIdx.x * (D + 1);
  float dq_acc[D];
#pragma unroll
  for (int c = 0; c < D; ++c) dq_acc[c] = 0.0f;
  const int64_t last_key = std::min(a.seq - 1, q0 + kRowsPerBlock - 1);
  for (int64_t j0 = 0; j0 <= last_key; j0 += kTile) {
    __syncthreads();
    stage_rows<T, D>(k_s, D, k, a.ldk, kvh * D, t0, j0, kTile, a.seq);
    stage_rows<T, D>(v_s, D, v, a.ldv, kvh * D, t0, j0, kTile, a.seq);
    __syncthreads();
    const int keys = valid ? static_cast<int>(std::min<int64_t>(kTile, i - j0 + 1)) : 0;
    for (int jj = 0; jj < keys; ++jj) {
      const float* kj = k_s + jj * D;
      const float p = expf(dot_row<D>(my_q, kj) * scale - lse_i);
      const float ds = p * (dot_row<D>(my_do, v_s + jj * D) - delta_i) * scale;
#pragma unroll
      for (int c = 0; c < D; ++c) dq_acc[c] += ds * kj[c];
    }
  }
  if (!valid) return;
  T* dq_row = dq + (t0 + i) * a.ldq + h * D;
#pragma unroll
  for (int c = 0; c < D; ++c) dq_row[c] = from_float<T>(dq_acc[c]);
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  FSDP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
}

// Calls f(std::integral_constant<int, D>{}) for the supported head dims.
template <typename F>
void dispatch_head_dim(int64_t head_dim, F&& f) {
  switch (head_dim) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default:
      FSDP_FAIL("attention on CUDA cores supports head_dim 16, 32, 64 or 128, got ", head_dim);
  }
}

dim3 grid_for(const AttentionArgs& a, int64_t heads) {
  return dim3(static_cast<unsigned>((a.seq + kRowsPerBlock - 1) / kRowsPerBlock),
              static_cast<unsigned>(heads), static_cast<unsigned>(a.batch));
}

}  // namespace

void attention_forward_simt(cudaStream_t stream, const AttentionArgs& a, DType t, const void* q,
                            const void* k, const void* v, void* out, float* lse) {
  FSDP_CHECK(a.batch <= 65535 && a.heads <= 65535, "attention: batch ", a.batch, " or heads ",
             a.heads, " exceeds the grid");
  dispatch_head_dim(a.head_dim, [&](auto d) {
    constexpr int D = decltype(d)::value;
    const size_t smem = sizeof(float) * 2 * kTile * D;
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      allow_smem(forward_kernel<T, D>, smem);
      forward_kernel<T, D><<<grid_for(a, a.heads), kRowsPerBlock, smem, stream>>>(
          a, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<T*>(out), lse);
    });
    FSDP_CUDA_CHECK_LAUNCH();
  });
}

void attention_backward_simt(cudaStream_t stream, cudaMemPool_t scratch_pool,
                             const AttentionArgs& a, DType t, const void* q, const void* k,
                             const void* v, const void* out, const void* dout, const float* lse,
                             void* dq, void* dk, void* dv) {
  FSDP_CHECK(a.batch <= 65535 && a.heads <= 65535, "attention: batch ", a.batch, " or heads ",
             a.heads, " exceeds the grid");
  const int64_t rows = a.batch * a.heads * a.seq;
  void* delta_mem = nullptr;
  FSDP_CUDA_CHECK(cudaMallocFromPoolAsync(&delta_mem, static_cast<size_t>(rows) * sizeof(float),
                                          scratch_pool, stream));
  auto* delta = static_cast<float*>(delta_mem);
  try {
    dispatch_head_dim(a.head_dim, [&](auto d) {
      constexpr int D = decltype(d)::value;
      const size_t dkdv_smem = sizeof(float) * (2 * kRowsPerBlock * (D + 1) +
                                                2 * kQueryTile * D + 2 * kQueryTile);
      const size_t dq_smem = sizeof(float) * (2 * kRowsPerBlock * (D + 1) + 2 * kTile * D);
      dispatch_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        const auto* qs = static_cast<const T*>(q);
        const auto* ks = static_cast<const T*>(k);
        const auto* vs = static_cast<const T*>(v);
        const auto* dos = static_cast<const T*>(dout);
        delta_kernel<T><<<blocks_for(rows * 32), kThreads, 0, stream>>>(
            a, static_cast<const T*>(out), dos, delta);
        FSDP_CUDA_CHECK_LAUNCH();
        allow_smem(dkdv_kernel<T, D>, dkdv_smem);
        dkdv_kernel<T, D><<<grid_for(a, a.kv_heads), kRowsPerBlock, dkdv_smem, stream>>>(
            a, qs, ks, vs, dos, lse, delta, static_cast<T*>(dk), static_cast<T*>(dv));
        FSDP_CUDA_CHECK_LAUNCH();
        allow_smem(dq_kernel<T, D>, dq_smem);
        dq_kernel<T, D><<<grid_for(a, a.heads), kRowsPerBlock, dq_smem, stream>>>(
            a, qs, ks, vs, dos, lse, delta, static_cast<T*>(dq));
        FSDP_CUDA_CHECK_LAUNCH();
      });
    });
  } catch (...) {
    (void)cudaFreeAsync(delta_mem, stream);
    throw;
  }
  FSDP_CUDA_CHECK(cudaFreeAsync(delta_mem, stream));
}

}  // namespace fsdp::cuda::kernels
