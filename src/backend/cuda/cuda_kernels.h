// Host-side entry points of the CUDA kernels (implemented in the kernels_*.cu files).
// Every function enqueues on `stream`, checks the launch, and returns without synchronizing.
// Pointers are device pointers unless the name says host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fsdp/device.h"
#include "fsdp/dtype.h"

namespace fsdp::cuda::kernels {

// ---- multi-tensor launches (Note [Multi-tensor launches] in multi_tensor.cuh)
// A launch covers many tensors; each is cut into tiles of kTileElems elements and every block
// takes tiles grid-stride. Up to kInlineDescs descriptors travel inside the kernel parameters
// (copied by the launch itself, so the host array may change right after the call); longer
// lists are read from a device copy the caller uploaded (`device_descs`).
constexpr int kInlineDescs = 64;
constexpr int64_t kTileElems = 8192;

// One parameter of an FSDP group. "Work" index e runs over the unsharded side:
//   all-gather copy-out:      e in [0, rows*cols)                 dst[e] = gathered[shard_pos(e)]
//   reduce-scatter copy-in:   e in [0, world*rows_per_rank*cols)  rs_in[shard_pos(e)] = e <
//   rows*cols ? src[e] : 0
// with shard_pos(e) = r*shard_numel + offset + (e - r*chunk), r = e / chunk,
// chunk = rows_per_rank*cols (Note [Shard layout]).
struct ShardCopyDesc {
  const void* unsharded_src = nullptr;  // RS: the grad (type src_type); AG: unused
  void* unsharded_dst = nullptr;        // AG: the unsharded param; RS: unused
  int64_t work_numel = 0;
  int64_t valid_numel = 0;  // rows*cols
  int64_t chunk_numel = 0;  // rows_per_rank*cols
  int64_t offset = 0;
  int64_t tile_begin = 0;  // set by assign_tiles
  DType src_type = DType::F32;
  bool vectorized = false;  // every access of this param is pack-aligned
};

struct OptimDesc {
  float* param = nullptr;
  const void* grad = nullptr;  // fp32, or bf16 where grad_bf16
  float* state0 = nullptr;
  float* state1 = nullptr;
  int64_t work_numel = 0;
  int64_t tile_begin = 0;
  bool vectorized = false;
  bool grad_bf16 = false;
  void* param_copy = nullptr;  // the updated param also lands here (OptimTensor::param_copy)
  bool copy_bf16 = false;
};

// Numbers the tiles of each descriptor; returns the launch's total tile count.
template <typename Desc>
int64_t assign_tiles(Desc* descs, int count) {
  int64_t tiles = 0;
  for (int i = 0; i < count; ++i) {
    descs[i].tile_begin = tiles;
    tiles += (descs[i].work_numel + kTileElems - 1) / kTileElems;
  }
  return tiles;
}

void all_gather_copy_out(cudaStream_t stream, const void* gathered, DType t, int64_t shard_numel,
                         const ShardCopyDesc* host_descs, const ShardCopyDesc* device_descs,
                         int count, int64_t total_tiles);
void reduce_scatter_copy_in(cudaStream_t stream, void* rs_in, DType rs_t, int64_t shard_numel,
                            const ShardCopyDesc* host_descs, const ShardCopyDesc* device_descs,
                            int count, int64_t total_tiles);

struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;       // 1 - beta1^step
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
};
void adamw(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs,
           int count, int64_t total_tiles, const AdamWParams& params);
void sgd(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs, int count,
         int64_t total_tiles, float lr, float momentum, float weight_decay);
// Note [Step scalars]: lr, bias corrections and clipping read from device memory.
void adamw_scalars(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs,
                   int count, int64_t total_tiles, const AdamWParams& params,
                   const StepScalars* scalars, GradSquares grad_sq);
void sgd_scalars(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs,
                 int count, int64_t total_tiles, float momentum, float weight_decay,
                 const StepScalars* scalars, GradSquares grad_sq);
// out[i] = sum of squares of descriptor i's grad array (work_numel elements); partial holds
// total_tiles floats of scratch.
void sum_squares(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs,
                 int count, int64_t total_tiles, float* partial, float* out);

// ---- elementwise
void fill(cudaStream_t stream, void* dst, DType t, int64_t n, float value);
void cast(cudaStream_t stream, void* dst, DType dst_t, const void* src, DType src_t, int64_t n);
void accumulate(cudaStream_t stream, float* dst, const void* src, DType src_t, int64_t n,
                float scale);
void scale_in_place(cudaStream_t stream, void* x, DType t, int64_t n, float factor);
void activation_forward(cudaStream_t stream, Activation f, const void* x, void* y, DType t,
                        int64_t n);
void activation_backward(cudaStream_t stream, Activation f, const void* x, const void* dy, void* dx,
                         DType t, int64_t n);
void add(cudaStream_t stream, void* out, const void* a, const void* b, DType t, int64_t n);
void spin(cudaStream_t stream, uint64_t nanoseconds);
// Device::synthetic_batch: the values of include/fsdp/synthetic.h, bit-identical to the host.
void synthetic_batch(cudaStream_t stream, void* dst, DType t, int64_t rows, int64_t cols,
                     uint64_t seed, int64_t step, int64_t first_row, float bound);
void synthetic_labels(cudaStream_t stream, int32_t* labels, int64_t rows, int64_t width,
                      uint64_t seed, int64_t step, int64_t first_row, float bound);

// ---- row-wise ops and losses. The losses reduce in two deterministic passes through a
// scratch buffer taken from (and returned to) `scratch_pool`, stream-ordered.
void softmax_rows(cudaStream_t stream, const void* x, DType t, float* probs, int64_t rows,
                  int64_t cols);
void softmax_rows_backward(cudaStream_t stream, const float* probs, const float* dprobs, void* dx,
                           DType t, int64_t rows, int64_t cols);
void scale_rows(cudaStream_t stream, void* out, const void* in, DType t, const float* w,
                int64_t w_stride, int64_t rows, int64_t cols, bool accumulate);
void row_dot(cudaStream_t stream, const void* a, const void* b, DType t, float* out,
             int64_t out_stride, int64_t rows, int64_t cols);
// Note [Device MoE routing] (kernels_moe_routing.cu); arguments checked by the caller.
void moe_route(cudaStream_t stream, cudaMemPool_t scratch_pool, const Device::MoeRouting& r);
void moe_route_backward(cudaStream_t stream, const Device::MoeRouting& r,
                        const float* dsend_weight, float* dprobs);
void mean_square_loss(cudaStream_t stream, cudaMemPool_t scratch_pool, const void* y, DType t,
                      int64_t n, float* loss, void* dy);
void cross_entropy_loss(cudaStream_t stream, cudaMemPool_t scratch_pool, const void* logits,
                        DType t, const int32_t* labels, int64_t rows, int64_t classes, float* loss,
                        void* dlogits);

// ---- transformer ops (Note [Transformer ops]; kernels_transformer.cu). Shapes are checked by
// the CudaDevice callers; scratch (the embedding backward's sort, RMSNorm's dw partials) is
// stream-ordered from `scratch_pool`.
void embedding_forward(cudaStream_t stream, const void* table, DType t, const int32_t* ids,
                       int64_t rows, int64_t dim, void* out);
void embedding_backward(cudaStream_t stream, cudaMemPool_t scratch_pool, const void* dy, DType t,
                        const int32_t* ids, int64_t rows, int64_t dim, int64_t vocab,
                        void* dtable);
// RMSNorm (kernels_rms_norm.cu). With a residual, the forward first forms h = x + residual
// (Device::add_rms_norm_forward); with a dresidual, the backward adds it to dx
// (Device::rms_norm_backward_add). Both may be null: the plain ops. amax, when not null, gets
// max |y| (forward) or max |dx| (backward) as stored (Note [Fused amax]).
void rms_norm_forward(cudaStream_t stream, const void* x, const void* residual, const void* w,
                      DType t, int64_t rows, int64_t cols, float eps, void* h, void* y,
                      float* rstd, float* amax);
void rms_norm_backward(cudaStream_t stream, cudaMemPool_t scratch_pool, const void* x,
                       const void* w, const float* rstd, const void* dy, const void* dresidual,
                       DType t, int64_t rows, int64_t cols, void* dx, void* dw, float* amax);
// The widest RMSNorm row the backward handles (its dw partials live in shared memory).
constexpr int64_t kRmsNormMaxCols = 12288;
// inv_freq[i] = theta^(-2i/head_dim), computed on the host exactly as the CPU backend does.
constexpr int kRopeMaxHalf = 256;
struct RopeFreqs {
  float inv_freq[kRopeMaxHalf];
};
// Row r is at position first_position + r % seq_len (0 for training; Note [KV cache]).
void rope(cudaStream_t stream, void* x, int64_t ld, DType t, int64_t rows, int64_t heads,
          int64_t head_dim, int64_t seq_len, int64_t first_position, const RopeFreqs& freqs,
          bool inverse);
// amax: Note [Fused amax] (Device::swiglu_forward); null: none.
void swiglu_forward(cudaStream_t stream, const void* h, DType t, int64_t rows, int64_t ffn,
                    void* out, float* amax);
void swiglu_backward(cudaStream_t stream, const void* h, const void* dout, DType t, int64_t rows,
                     int64_t ffn, void* dh, float* amax);

// ---- fp8 (kernels_fp8.cu): Device::fp8_amax and fp8_cast's contracts; transpose_u8 writes
// src [rows, cols] as dst [cols, rows].
void fp8_amax(cudaStream_t stream, const void* x, DType t, int64_t rows, int64_t cols,
              Device::Fp8Axis axis, float* amax);
void fp8_cast(cudaStream_t stream, const void* x, DType t, DType value_t, int64_t rows,
              int64_t cols, Device::Fp8Axis axis, const float* amax, Fp8Format f, uint8_t* q,
              uint8_t* q_t, float* scale_inv);
void transpose_u8(cudaStream_t stream, const uint8_t* src, int64_t rows, int64_t cols,
                  uint8_t* dst);
// c[i, j] = acc[i, j] * row_scale[i] * col_scale[j], as c_t: rowwise scales applied after an
// unscaled fp8 GEMM.
void fp8_scale_outer(cudaStream_t stream, const float* acc, int64_t rows, int64_t cols,
                     const float* row_scale, const float* col_scale, void* c, DType c_t);

// ---- attention on CUDA cores (attention_simt.cu): flash-style tiles, fp32 math, no T x T
// buffer. The path for fp32 activations (cuDNN's fused attention is fp16/bf16 only), and for
// bf16 when FSDP_ATTENTION=simt asks for it. Layout and lse as Device::attention_forward.
struct AttentionArgs {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t ldq = 0, ldk = 0, ldv = 0, ldo = 0, lddo = 0;
};
constexpr int64_t kSimtAttentionMaxHeadDim = 128;
// Note [KV cache] (kernels_kv_cache.cu): Device::attention_kv_cache, fp32 math, an online
// softmax over tiles of cached keys, one block per (new row, head).
constexpr int64_t kKvCacheMaxHeadDim = 256;
void attention_kv_cache(cudaStream_t stream, DType t, const void* q, int64_t ldq, const void* k,
                        int64_t ldk, const void* v, int64_t ldv, int64_t rows, int64_t position,
                        int64_t heads, int64_t kv_heads, int64_t head_dim, void* k_cache,
                        void* v_cache, void* out, int64_t ldo);
void attention_forward_simt(cudaStream_t stream, const AttentionArgs& a, DType t, const void* q,
                            const void* k, const void* v, void* out, float* lse);
// Needs `delta` scratch of batch*heads*seq floats (rowwise dout . out).
void attention_backward_simt(cudaStream_t stream, cudaMemPool_t scratch_pool,
                             const AttentionArgs& a, DType t, const void* q, const void* k,
                             const void* v, const void* out, const void* dout, const float* lse,
                             void* dq, void* dk, void* dv);

}  // namespace fsdp::cuda::kernels
