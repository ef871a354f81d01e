// Multi-tensor optimizer steps over fp32 shards: every shard of a step in one launch
// (Note [Multi-tensor launches]). The math follows PyTorch's AdamW and SGD element for element,
// in fp32, so the CPU backend and these kernels agree to rounding.
#include "backend/cuda/multi_tensor.cuh"

namespace fsdp::cuda::kernels {
namespace {

// The grad as fp32, from fp32 or bf16 (Note [Optimizer in backward]: a reduce-scatter's bf16
// output is read as is, without an fp32 copy).
template <int W>
__device__ __forceinline__ void load_grad(const OptimDesc& d, int64_t e, float (&g)[W]) {
  if (d.grad_bf16)
    load_pack<W>(static_cast<const bf16*>(d.grad) + e, g);
  else
    load_pack<W>(static_cast<const float*>(d.grad) + e, g);
}

// The updated param into the descriptor's param_copy, if any (OptimTensor::param_copy),
// rounded as the cast kernel rounds.
template <int W>
__device__ __forceinline__ void store_param_copy(const OptimDesc& d, int64_t e, const float (&p)[W]) {
  if (!d.param_copy) return;
  if (d.copy_bf16)
    store_pack<W>(static_cast<bf16*>(d.param_copy) + e, p);
  else
    store_pack<W>(static_cast<float*>(d.param_copy) + e, p);
}

struct AdamWBody {
  AdamWParams c;
  float grad_scale = 1.0f;  // the clipping coefficient

  template <int W>
  __device__ void run(const OptimDesc& d, int64_t e) const {
    float p[W], g[W], m[W], v[W];
    load_pack<W>(d.param + e, p);
    load_grad<W>(d, e, g);
    load_pack<W>(d.state0 + e, m);
    load_pack<W>(d.state1 + e, v);
    const float decay = 1.0f - c.lr * c.weight_decay;  // decoupled weight decay, applied first
    const float step_size = c.lr / c.bias_correction1;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      g[i] *= grad_scale;
      p[i] *= decay;
      m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g[i];
      v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g[i] * g[i];
      const float denom = sqrtf(v[i]) / c.bias_correction2_sqrt + c.eps;
      p[i] -= step_size * m[i] / denom;
    }
    store_pack<W>(d.param + e, p);
    store_pack<W>(d.state0 + e, m);
    store_pack<W>(d.state1 + e, v);
    store_param_copy<W>(d, e, p);
  }

  // Note [Step scalars]: lr, bias corrections and the clip coefficient from device memory.
  __device__ void resolve(const StepScalars& s, float clip) {
    c.lr = s.lr;
    c.bias_correction1 = s.bias_correction1;
    c.bias_correction2_sqrt = s.bias_correction2_sqrt;
    grad_scale = clip;
  }
};

// buf = momentum * buf + (g + wd * p); p -= lr * buf. The engine zero-fills the buffer, which
// makes the first step's buf equal the gradient, as PyTorch's lazily created buffer does.
// With momentum 0 there is no buffer (state0 may be null).
struct SgdBody {
  float lr, momentum, weight_decay;
  float grad_scale = 1.0f;

  template <int W>
  __device__ void run(const OptimDesc& d, int64_t e) const {
    float p[W], g[W];
    load_pack<W>(d.param + e, p);
    load_grad<W>(d, e, g);
#pragma unroll
    for (int i = 0; i < W; ++i) g[i] = g[i] * grad_scale + weight_decay * p[i];
    if (momentum != 0.0f) {
      float buf[W];
      load_pack<W>(d.state0 + e, buf);
#pragma unroll
      for (int i = 0; i < W; ++i) {
        buf[i] = momentum * buf[i] + g[i];
        g[i] = buf[i];
      }
      store_pack<W>(d.state0 + e, buf);
    }
#pragma unroll
    for (int i = 0; i < W; ++i) p[i] -= lr * g[i];
    store_pack<W>(d.param + e, p);
    store_param_copy<W>(d, e, p);
  }

  __device__ void resolve(const StepScalars& s, float clip) {
    lr = s.lr;
    grad_scale = clip;
  }
};

// PyTorch's clip_grad_norm_ coefficient, min(1, max / (norm + 1e-6)); 1 without clipping. A
// non-finite norm gives NaN on purpose (the trainer reads the norm and stops at that step).
__device__ float clip_coefficient(const StepScalars& s, GradSquares grad_sq) {
  if (s.max_grad_norm <= 0.0f) return 1.0f;
  float total = 0.0f;
  for (int i = 0; i < grad_sq.count; ++i) total += grad_sq.sums[i];
  const float coef = s.max_grad_norm / (sqrtf(total) + 1e-6f);
  return (coef < 1.0f || isnan(coef)) ? coef : 1.0f;
}

// multi_tensor_kernel with the body's per-step scalars read once per block from device memory.
template <typename Body>
__global__ void __launch_bounds__(kThreads)
    scalars_kernel(const __grid_constant__ DescBatch<OptimDesc> batch, Body body,
                   const StepScalars* scalars, GradSquares grad_sq) {
  __shared__ float shared[4];  // lr, bias corrections, clip coefficient
  if (threadIdx.x == 0) {
    const StepScalars s = *scalars;
    shared[0] = s.lr;
    shared[1] = s.bias_correction1;
    shared[2] = s.bias_correction2_sqrt;
    shared[3] = clip_coefficient(s, grad_sq);
  }
  __syncthreads();
  StepScalars step;
  step.lr = shared[0];
  step.bias_correction1 = shared[1];
  step.bias_correction2_sqrt = shared[2];
  body.resolve(step, shared[3]);
  const OptimDesc* descs = batch.device_descs ? batch.device_descs : batch.inline_descs;
  for (int64_t tile = blockIdx.x; tile < batch.total_tiles; tile += gridDim.x) {
    const OptimDesc& d = descs[find_desc(descs, batch.count, tile)];
    const int64_t begin = (tile - d.tile_begin) * kTileElems;
    const int64_t end = min(begin + kTileElems, d.work_numel);
    int64_t scalar_begin = begin;
    if (d.vectorized) {
      scalar_begin = begin + (end - begin) / kVec * kVec;
      for (int64_t e = begin + threadIdx.x * kVec; e < scalar_begin; e += blockDim.x * kVec)
        body.template run<kVec>(d, e);
    }
    for (int64_t e = scalar_begin + threadIdx.x; e < end; e += blockDim.x)
      body.template run<1>(d, e);
  }
}

DescBatch<OptimDesc> make_batch(const OptimDesc* host_descs, const OptimDesc* device_descs,
                                int count, int64_t total_tiles) {
  DescBatch<OptimDesc> batch;
  batch.count = count;
  batch.total_tiles = total_tiles;
  if (count <= kInlineDescs) {
    for (int i = 0; i < count; ++i) batch.inline_descs[i] = host_descs[i];
  } else {
    FSDP_CHECK(device_descs != nullptr, count, " descriptors need an uploaded device copy");
    batch.device_descs = device_descs;
  }
  return batch;
}

template <typename Body>
void launch_scalars(cudaStream_t stream, const OptimDesc* host_descs,
                    const OptimDesc* device_descs, int count, int64_t total_tiles,
                    const Body& body, const StepScalars* scalars, GradSquares grad_sq) {
  if (count <= 0 || total_tiles <= 0) return;
  const DescBatch<OptimDesc> batch = make_batch(host_descs, device_descs, count, total_tiles);
  const int blocks = static_cast<int>(std::min<int64_t>(total_tiles, kMaxBlocks));
  scalars_kernel<Body><<<blocks, kThreads, 0, stream>>>(batch, body, scalars, grad_sq);
  FSDP_CUDA_CHECK_LAUNCH();
}

// Sum of squares, deterministic: each tile's partial sum lands in partial[tile] (a fixed
// order within the block), then one block per tensor adds its tiles' partials in order.
__global__ void __launch_bounds__(kThreads)
    sum_squares_tiles_kernel(const __grid_constant__ DescBatch<OptimDesc> batch, float* partial) {
  const OptimDesc* descs = batch.device_descs ? batch.device_descs : batch.inline_descs;
  for (int64_t tile = blockIdx.x; tile < batch.total_tiles; tile += gridDim.x) {
    const OptimDesc& d = descs[find_desc(descs, batch.count, tile)];
    const int64_t begin = (tile - d.tile_begin) * kTileElems;
    const int64_t end = min(begin + kTileElems, d.work_numel);
    float sum = 0.0f;
    for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
      const float x = static_cast<const float*>(d.grad)[e];  // fp32 grads only
      sum += x * x;
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[tile] = sum;
  }
}

__global__ void __launch_bounds__(kThreads)
    sum_squares_finish_kernel(const __grid_constant__ DescBatch<OptimDesc> batch,
                              const float* partial, float* out) {
  const OptimDesc* descs = batch.device_descs ? batch.device_descs : batch.inline_descs;
  for (int t = blockIdx.x; t < batch.count; t += gridDim.x) {
    const OptimDesc& d = descs[t];
    const int64_t tiles = (d.work_numel + kTileElems - 1) / kTileElems;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < tiles; i += blockDim.x) sum += partial[d.tile_begin + i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) out[t] = sum;
  }
}

}  // namespace

void adamw(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs,
           int count, int64_t total_tiles, const AdamWParams& params) {
  launch_multi_tensor(stream, host_descs, device_descs, count, total_tiles, AdamWBody{params});
}

void sgd(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs, int count,
         int64_t total_tiles, float lr, float momentum, float weight_decay) {
  launch_multi_tensor(stream, host_descs, device_descs, count, total_tiles,
                      SgdBody{lr, momentum, weight_decay});
}

}  // namespace fsdp::cuda::kernels

namespace fsdp::cuda::kernels {

void adamw_scalars(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs,
                   int count, int64_t total_tiles, const AdamWParams& params,
                   const StepScalars* scalars, GradSquares grad_sq) {
  launch_scalars(stream, host_descs, device_descs, count, total_tiles, AdamWBody{params}, scalars,
                 grad_sq);
}

void sgd_scalars(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs,
                 int count, int64_t total_tiles, float momentum, float weight_decay,
                 const StepScalars* scalars, GradSquares grad_sq) {
  launch_scalars(stream, host_descs, device_descs, count, total_tiles,
                 SgdBody{0.0f, momentum, weight_decay}, scalars, grad_sq);
}

void sum_squares(cudaStream_t stream, const OptimDesc* host_descs, const OptimDesc* device_descs,
                 int count, int64_t total_tiles, float* partial, float* out) {
  if (count <= 0) return;
  const DescBatch<OptimDesc> batch = make_batch(host_descs, device_descs, count, total_tiles);
  if (total_tiles > 0) {
    const int blocks = static_cast<int>(std::min<int64_t>(total_tiles, kMaxBlocks));
    sum_squares_tiles_kernel<<<blocks, kThreads, 0, stream>>>(batch, partial);
    FSDP_CUDA_CHECK_LAUNCH();
  }
  const int blocks = static_cast<int>(std::min<int64_t>(count, kMaxBlocks));
  sum_squares_finish_kernel<<<blocks, kThreads, 0, stream>>>(batch, partial, out);
  FSDP_CUDA_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
