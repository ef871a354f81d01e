// fp8 kernels (docs/fp8.md): amax per tensor, row or column, the scaled cast (the hardware
// cvt.rn.satfinite on sm_89+, through __nv_cvt_float_to_fp8), and a byte transpose for
// cuBLASLt's one fp8 layout. The scale arithmetic is the CPU backend's, operation for
// operation (Note [Fp8 scale] in fsdp/fp8.h), so the codes agree bit for bit
// (tests/gpu/test_fp8_casts.cpp).
#include <cuda_fp8.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

using Axis = Device::Fp8Axis;

// |x| as its bits: non-negative floats order as their bits, and NaN (0x7fc00000 and up)
// above infinity, so an integer max keeps NaN as the CPU's max does.
template <typename T>
__device__ __forceinline__ unsigned abs_bits(const T* x, int64_t i) {
  return __float_as_uint(fabsf(to_float(x[i])));
}

// Packs of kVec where x is pack-aligned (one 16-byte load per 8 bf16), then the tail.
template <typename T>
__global__ void amax_tensor_kernel(const T* x, int64_t n, bool vectorized, unsigned* amax_bits) {
  unsigned m = 0;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = vectorized ? n / kVec : 0;
  for (int64_t p = first; p < packs; p += stride) {
    float v[kVec];
    load_pack<kVec>(x + p * kVec, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) m = max(m, __float_as_uint(fabsf(v[i])));
  }
  for (int64_t i = packs * kVec + first; i < n; i += stride) m = max(m, abs_bits(x, i));
  m = block_max_bits(m);
  if (threadIdx.x == 0) atomicMax(amax_bits, m);
}

template <typename T>
__global__ void amax_rows_kernel(const T* x, int64_t rows, int64_t cols, float* amax) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    unsigned m = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = max(m, abs_bits(x, r * cols + c));
    m = block_max_bits(m);
    if (threadIdx.x == 0) amax[r] = __uint_as_float(m);
    __syncthreads();  // warp_max is reused by the next row
  }
}

// Threads over columns (coalesced), blockIdx.y over bands of rows; the bands meet in an
// atomic max (the buffer zeroed first).
template <typename T>
__global__ void amax_cols_kernel(const T* x, int64_t rows, int64_t cols, int64_t band,
                                 unsigned* amax_bits) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  unsigned m = 0;
  const int64_t end = std::min<int64_t>(rows, (blockIdx.y + 1) * band);
  for (int64_t r = blockIdx.y * band; r < end; ++r) m = max(m, abs_bits(x, r * cols + c));
  atomicMax(amax_bits + c, m);
}

// The same with kVec adjacent columns per thread (cols a multiple of kVec, x pack-aligned):
// a warp reads whole 16-byte words of each row instead of 2-byte elements.
template <typename T>
__global__ void amax_col_packs_kernel(const T* x, int64_t rows, int64_t cols, int64_t band,
                                      unsigned* amax_bits) {
  const int64_t c = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * kVec;
  if (c >= cols) return;
  unsigned m[kVec] = {};
  const int64_t end = std::min<int64_t>(rows, (blockIdx.y + 1) * band);
  for (int64_t r = blockIdx.y * band; r < end; ++r) {
    float v[kVec];
    load_pack<kVec>(x + r * cols + c, v);
#pragma unroll
    for (int i = 0; i < kVec; ++i) m[i] = max(m[i], __float_as_uint(fabsf(v[i])));
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) atomicMax(amax_bits + c + i, m[i]);
}

__device__ __forceinline__ float round_to(float v, bool to_bf16) {
  return to_bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// fp8_scale_of, written as std::max is: a NaN amax stays NaN (fmaxf would drop it).
__device__ __forceinline__ float scale_of(float amax, float max_value) {
  return max_value / (amax < kFp8AmaxFloor ? kFp8AmaxFloor : amax);
}

// Any shape and alignment, one element per thread step.
template <typename T>
__global__ void cast_kernel(const T* x, int64_t rows, int64_t cols, Axis axis, bool to_bf16,
                            const float* amax, __nv_fp8_interpretation_t format, float max_value,
                            uint8_t* q, uint8_t* q_t, float* scale_inv, int64_t scales) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n || i < scales;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (i < scales && scale_inv) scale_inv[i] = 1.0f / scale_of(round_to(amax[i], to_bf16), max_value);
    if (i >= n) continue;
    const int64_t s = axis == Axis::Tensor ? 0 : axis == Axis::Rows ? i / cols : i % cols;
    const float scale = scale_of(round_to(amax[s], to_bf16), max_value);
    const uint8_t code = __nv_cvt_float_to_fp8(round_to(to_float(x[i]), to_bf16) * scale,
                                               __NV_SATFINITE, format);
    if (q) q[i] = code;
    if (q_t) q_t[(i % cols) * rows + i / cols] = code;
  }
}

// Note [Fp8 cast tiles]: the cast of a pack-friendly tensor (cols a multiple of kVec, rows of
// kTransposeRun when transposing, 16-byte aligned buffers) goes tile by tile, a block per
// kCastTile x kCastTile tile: 16-byte loads of x, 8-byte stores of q, the tile's scales
// computed once, and the transposed codes (q_t) written from shared memory in 16-byte runs
// of a column. The generic kernel took a division per element and wrote single bytes; with
// the separate transpose that the weight gradient needed, the casts cost about as much as the
// fp8 GEMMs saved (docs/fp8.md).
constexpr int kCastTile = 64;
constexpr int kTransposeRun = 16;  // rows of one column a thread writes to q_t

template <typename T>
__global__ void cast_tiles_kernel(const T* x, int64_t rows, int64_t cols, int64_t tiles_c,
                                  Axis axis, bool to_bf16, const float* amax,
                                  __nv_fp8_interpretation_t format, float max_value, uint8_t* q,
                                  uint8_t* q_t, float* scale_inv, int64_t scales) {
  __shared__ __align__(16) uint8_t codes[kCastTile][kCastTile + 8];
  __shared__ float tile_scale[kCastTile];
  const int64_t r0 = (blockIdx.x / tiles_c) * kCastTile, c0 = (blockIdx.x % tiles_c) * kCastTile;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < scales;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (scale_inv) scale_inv[i] = 1.0f / scale_of(round_to(amax[i], to_bf16), max_value);
  if (threadIdx.x < kCastTile) {
    const int64_t s = axis == Axis::Tensor ? 0 : (axis == Axis::Rows ? r0 : c0) + threadIdx.x;
    if (s < scales) tile_scale[threadIdx.x] = scale_of(round_to(amax[s], to_bf16), max_value);
  }
  __syncthreads();
  constexpr int kPacksPerRow = kCastTile / kVec;
  for (int p = threadIdx.x; p < kCastTile * kPacksPerRow; p += blockDim.x) {
    const int tr = p / kPacksPerRow, tc = (p % kPacksPerRow) * kVec;
    const int64_t r = r0 + tr, c = c0 + tc;
    if (r >= rows || c >= cols) continue;  // cols is a multiple of kVec: whole packs
    float v[kVec];
    load_pack<kVec>(x + r * cols + c, v);
    uint32_t word[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float scale = tile_scale[axis == Axis::Tensor ? 0 : axis == Axis::Rows ? tr : tc + i];
      const uint32_t code =
          __nv_cvt_float_to_fp8(round_to(v[i], to_bf16) * scale, __NV_SATFINITE, format);
      word[i / 4] |= code << (8 * (i % 4));
    }
    const uint2 packed = make_uint2(word[0], word[1]);
    if (q) *reinterpret_cast<uint2*>(q + r * cols + c) = packed;
    if (q_t) *reinterpret_cast<uint2*>(&codes[tr][tc]) = packed;
  }
  if (!q_t) return;
  __syncthreads();
  constexpr int kRunsPerCol = kCastTile / kTransposeRun;
  for (int p = threadIdx.x; p < kCastTile * kRunsPerCol; p += blockDim.x) {
    const int tc = p / kRunsPerCol, tr = (p % kRunsPerCol) * kTransposeRun;
    const int64_t c = c0 + tc, r = r0 + tr;
    if (c >= cols || r >= rows) continue;  // rows is a multiple of kTransposeRun
    uint32_t word[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < kTransposeRun; ++j) word[j / 4] |= uint32_t{codes[tr + j][tc]} << (8 * (j % 4));
    *reinterpret_cast<uint4*>(q_t + c * rows + r) = make_uint4(word[0], word[1], word[2], word[3]);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__global__ void transpose_u8_kernel(const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst) {
  __shared__ uint8_t tile[32][33];
  const int64_t r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int64_t r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[j][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int64_t c = c0 + j, r = r0 + threadIdx.x;  // dst is [cols, rows]
    if (c < cols && r < rows) dst[c * rows + r] = tile[threadIdx.x][j];
  }
}

// The same in 16-byte words (rows and cols multiples of 16, aligned buffers), a 64 x 64 tile
// per block: the transpose of the weight before every fp8 dX GEMM, moved a byte per thread,
// cost about a sixth of that GEMM.
__global__ void transpose_u8_words_kernel(const uint8_t* src, int64_t rows, int64_t cols,
                                          int64_t tiles_c, uint8_t* dst) {
  __shared__ __align__(16) uint8_t tile[kCastTile][kCastTile + 16];
  const int64_t r0 = (blockIdx.x / tiles_c) * kCastTile, c0 = (blockIdx.x % tiles_c) * kCastTile;
  constexpr int kWords = kCastTile / 16;
  for (int p = threadIdx.x; p < kCastTile * kWords; p += blockDim.x) {
    const int tr = p / kWords, tc = (p % kWords) * 16;
    if (r0 + tr < rows && c0 + tc < cols)
      *reinterpret_cast<uint4*>(&tile[tr][tc]) =
          *reinterpret_cast<const uint4*>(src + (r0 + tr) * cols + c0 + tc);
  }
  __syncthreads();
  for (int p = threadIdx.x; p < kCastTile * kWords; p += blockDim.x) {
    const int tc = p / kWords, tr = (p % kWords) * 16;  // dst row c0 + tc, columns r0 + tr...
    if (c0 + tc >= cols || r0 + tr >= rows) continue;
    uint32_t word[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < 16; ++j) word[j / 4] |= uint32_t{tile[tr + j][tc]} << (8 * (j % 4));
    *reinterpret_cast<uint4*>(dst + (c0 + tc) * rows + r0 + tr) =
        make_uint4(word[0], word[1], word[2], word[3]);
  }
}

template <typename T>
__global__ void scale_outer_kernel(const float* acc, int64_t rows, int64_t cols,
                                   const float* row_scale, const float* col_scale, T* c) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    c[i] = from_float<T>(acc[i] * row_scale[i / cols] * col_scale[i % cols]);
}

}  // namespace

void fp8_amax(cudaStream_t stream, const void* x, DType t, int64_t rows, int64_t cols, Axis axis,
              float* amax) {
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(x);
    if (axis == Axis::Tensor) {
      FSDP_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
      const bool vectorized = aligned_for_packs(p);
      if (rows * cols > 0)
        amax_tensor_kernel<<<blocks_for(vectorized ? rows * cols / kVec + 1 : rows * cols),
                             kThreads, 0, stream>>>(p, rows * cols, vectorized,
                                                    reinterpret_cast<unsigned*>(amax));
    } else if (axis == Axis::Rows) {
      if (rows > 0)
        amax_rows_kernel<<<static_cast<int>(std::min<int64_t>(rows, 65535)), kThreads, 0, stream>>>(
            p, rows, cols, amax);
    } else if (cols > 0) {
      FSDP_CUDA_CHECK(cudaMemsetAsync(amax, 0, static_cast<size_t>(cols) * sizeof(float), stream));
      const int64_t band = 64;
      const bool packs = cols % kVec == 0 && aligned_for_packs(p);
      const int64_t threads_across = packs ? cols / kVec : cols;
      const dim3 grid(static_cast<unsigned>((threads_across + kThreads - 1) / kThreads),
                      static_cast<unsigned>(std::clamp<int64_t>((rows + band - 1) / band, 1, 65535)));
      const int64_t rows_per_band = (rows + grid.y - 1) / grid.y;
      auto* bits = reinterpret_cast<unsigned*>(amax);
      if (rows > 0 && packs)
        amax_col_packs_kernel<<<grid, kThreads, 0, stream>>>(p, rows, cols, rows_per_band, bits);
      else if (rows > 0)
        amax_cols_kernel<<<grid, kThreads, 0, stream>>>(p, rows, cols, rows_per_band, bits);
    }
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void fp8_cast(cudaStream_t stream, const void* x, DType t, DType value_t, int64_t rows,
              int64_t cols, Axis axis, const float* amax, Fp8Format f, uint8_t* q, uint8_t* q_t,
              float* scale_inv) {
  const int64_t scales = axis == Axis::Tensor ? 1 : axis == Axis::Rows ? rows : cols;
  const __nv_fp8_interpretation_t format = f == Fp8Format::E4M3 ? __NV_E4M3 : __NV_E5M2;
  const bool to_bf16 = value_t == DType::BF16;
  // Note [Fp8 cast tiles]
  const bool tiles = rows * cols > 0 && cols % kVec == 0 && aligned16(x) && aligned16(q) &&
                     (q_t == nullptr || (rows % kTransposeRun == 0 && aligned16(q_t)));
  dispatch_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    if (tiles) {
      const int64_t tiles_c = (cols + kCastTile - 1) / kCastTile;
      const int64_t blocks = (rows + kCastTile - 1) / kCastTile * tiles_c;
      FSDP_CHECK(blocks <= int64_t{INT32_MAX}, "fp8_cast: ", rows, "x", cols, " is too large");
      cast_tiles_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          static_cast<const T*>(x), rows, cols, tiles_c, axis, to_bf16, amax, format,
          fp8_spec(f).max, q, q_t, scale_inv, scales);
    } else {
      cast_kernel<<<blocks_for(std::max(rows * cols, scales)), kThreads, 0, stream>>>(
          static_cast<const T*>(x), rows, cols, axis, to_bf16, amax, format, fp8_spec(f).max, q,
          q_t, scale_inv, scales);
    }
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

void transpose_u8(cudaStream_t stream, const uint8_t* src, int64_t rows, int64_t cols,
                  uint8_t* dst) {
  if (rows == 0 || cols == 0) return;
  if (rows % 16 == 0 && cols % 16 == 0 && aligned16(src) && aligned16(dst)) {
    const int64_t tiles_c = (cols + kCastTile - 1) / kCastTile;
    const int64_t blocks = (rows + kCastTile - 1) / kCastTile * tiles_c;
    FSDP_CHECK(blocks <= int64_t{INT32_MAX}, "transpose_u8: ", rows, "x", cols, " is too large");
    transpose_u8_words_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        src, rows, cols, tiles_c, dst);
  } else {
    const dim3 grid(static_cast<unsigned>((cols + 31) / 32),
                    static_cast<unsigned>((rows + 31) / 32));
    transpose_u8_kernel<<<grid, dim3(32, 8), 0, stream>>>(src, rows, cols, dst);
  }
  FSDP_CUDA_CHECK_LAUNCH();
}

void fp8_scale_outer(cudaStream_t stream, const float* acc, int64_t rows, int64_t cols,
                     const float* row_scale, const float* col_scale, void* c, DType c_t) {
  if (rows == 0 || cols == 0) return;
  dispatch_dtype(c_t, [&](auto tag) {
    using T = decltype(tag);
    scale_outer_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(
        acc, rows, cols, row_scale, col_scale, static_cast<T*>(c));
  });
  FSDP_CUDA_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
