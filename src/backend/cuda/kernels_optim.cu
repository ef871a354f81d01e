// Multi-tensor optimizer steps over fp32 shards: every shard of a step in one launch
// (Note [Multi-tensor launches]). The math follows PyTorch's AdamW and SGD element for element,
// in fp32, so the CPU backend and these kernels agree to rounding.
#include "backend/cuda/multi_tensor.cuh"

namespace fsdp::cuda::kernels {
namespace {

struct AdamWBody {
  AdamWParams c;

  template <int W>
  __device__ void run(const OptimDesc& d, int64_t e) const {
    float p[W], g[W], m[W], v[W];
    load_pack<W>(d.param + e, p);
    load_pack<W>(d.grad + e, g);
    load_pack<W>(d.state0 + e, m);
    load_pack<W>(d.state1 + e, v);
    const float decay = 1.0f - c.lr * c.weight_decay;  // decoupled weight decay, applied first
    const float step_size = c.lr / c.bias_correction1;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      p[i] *= decay;
      m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * g[i];
      v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * g[i] * g[i];
      const float denom = sqrtf(v[i]) / c.bias_correction2_sqrt + c.eps;
      p[i] -= step_size * m[i] / denom;
    }
    store_pack<W>(d.param + e, p);
    store_pack<W>(d.state0 + e, m);
    store_pack<W>(d.state1 + e, v);
  }
};

// buf = momentum * buf + (g + wd * p); p -= lr * buf. The engine zero-fills the buffer, which
// makes the first step's buf equal the gradient, as PyTorch's lazily created buffer does.
// With momentum 0 there is no buffer (state0 may be null).
struct SgdBody {
  float lr, momentum, weight_decay;

  template <int W>
  __device__ void run(const OptimDesc& d, int64_t e) const {
    float p[W], g[W];
    load_pack<W>(d.param + e, p);
    load_pack<W>(d.grad + e, g);
#pragma unroll
    for (int i = 0; i < W; ++i) g[i] += weight_decay * p[i];
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
  }
};

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
