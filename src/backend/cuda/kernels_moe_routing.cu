// The MoE layer's capacity-factor routing on the GPU (Note [Device MoE routing] in
// include/fsdp/device.h), in three launches:
// 1. one thread per token picks its top-k (repeatedly the best expert after the previous pick
//    in the order "higher probability, then lower index") and renormalizes; the same launch
//    fills the send order with padding;
// 2. one block per expert walks the assignments in order, group by group, a tile at a time:
//    a block-wide count of the tile's assignments to the expert gives each its place in the
//    expert's group queue (first come, first served up to the capacity), so the kept ones get
//    their send rows in assignment order. The block also sums the group's probabilities of the
//    expert (double, a fixed tree: deterministic) and writes the aux-loss gradient;
// 3. one thread adds up the aux loss and the max load over (group, expert) in the host's order.
// No atomics and no data-dependent launch shapes: the same inputs give the same bits, eager or
// in a graph.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/kernel_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kExpertThreads = 256;

__global__ void moe_top_k_kernel(Device::MoeRouting r) {
  const int E = r.experts, K = r.top_k;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t send_rows = E * r.slots();
  for (int64_t i = first; i < send_rows; i += stride) {
    r.send_assignment[i] = -1;
    r.send_token[i] = static_cast<int32_t>(r.tokens);
    r.send_weight[i] = 0.0f;
  }
  for (int64_t t = first; t < r.tokens; t += stride) {
    const float* p = r.probs + t * E;
    int32_t* chosen = r.chosen + t * K;
    float sum = 0.0f;
    int prev = -1;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      float best_p = 0.0f;
      for (int e = 0; e < E; ++e) {
        const float v = p[e];
        // Only experts after the previous pick; e rises, so a tie keeps the lower index.
        if (prev >= 0 && !(v < p[prev] || (v == p[prev] && e > prev))) continue;
        if (best < 0 || v > best_p) {
          best = e;
          best_p = v;
        }
      }
      if (best < 0) {  // NaN probabilities: any expert not picked yet (the loss stops the run)
        for (int e = 0; e < E && best < 0; ++e) {
          bool taken = false;
          for (int j = 0; j < k; ++j) taken = taken || chosen[j] == e;
          if (!taken) best = e;
        }
      }
      chosen[k] = best;
      prev = best;
      sum = __fadd_rn(sum, p[best]);
    }
    for (int k = 0; k < K; ++k) r.weight[t * K + k] = __fdiv_rn(p[chosen[k]], sum);
  }
}

// The number of flagged threads before this one in the block, and the block's total.
__device__ int block_count_before(bool flag, int* total) {
  __shared__ int warp_counts[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  const unsigned mask = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_counts[warp] = __popc(mask);
  __syncthreads();
  int before = __popc(mask & ((1u << lane) - 1u)), sum = 0;
  for (int w = 0; w < warps; ++w) {
    before += w < warp ? warp_counts[w] : 0;
    sum += warp_counts[w];
  }
  __syncthreads();
  *total = sum;
  return before;
}

__device__ double block_sum_double(double v) {
  __shared__ double partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  double total = lane < warps ? partial[lane] : 0.0;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    total += __shfl_xor_sync(0xffffffffu, total, offset);
  __syncthreads();
  return total;
}

// Block e: expert e's queue in every group. routed and mean_prob are [groups * E] scratch.
__global__ void moe_assign_kernel(Device::MoeRouting r, int32_t* routed, double* mean_prob) {
  const int E = r.experts, K = r.top_k, e = blockIdx.x;
  const int64_t group = r.group_tokens, groups = r.groups(), slots = r.slots();
  int64_t sent = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * group * K, end = (g + 1) * group * K;
    int64_t queued = 0;  // assignments of the group routed to e so far
    for (int64_t base = begin; base < end; base += blockDim.x) {
      const int64_t a = base + threadIdx.x;
      const bool mine = a < end && r.chosen[a] == e;
      int tile = 0;
      const int64_t place = queued + block_count_before(mine, &tile);
      if (mine) {
        if (place < r.capacity) {
          const int64_t row = e * slots + sent + place;
          r.slot[a] = static_cast<int32_t>(row);
          r.send_assignment[row] = static_cast<int32_t>(a);
          r.send_token[row] = static_cast<int32_t>(a / K);
          r.send_weight[row] = r.weight[a];
        } else {
          r.slot[a] = -1;
        }
      }
      queued += tile;
    }
    double p = 0.0;
    for (int64_t t = g * group + threadIdx.x; t < (g + 1) * group; t += blockDim.x)
      p += r.probs[t * E + e];
    p = block_sum_double(p);
    if (threadIdx.x == 0) {
      routed[g * E + e] = static_cast<int32_t>(queued);
      mean_prob[g * E + e] = p;
      const double f = static_cast<double>(queued) / static_cast<double>(group * K);
      // The host's weight * E * f / (group * groups): weight * E in fp32, the rest in double.
      const double weight_e = __fmul_rn(r.aux_loss_weight, static_cast<float>(E));
      r.aux_grad[g * E + e] = static_cast<float>(
          __dmul_rn(weight_e, f) / (static_cast<double>(group) * static_cast<double>(groups)));
    }
    sent += queued < r.capacity ? queued : r.capacity;
  }
}

// The host's sums: per group E * sum_e f_e P_e, their mean times the weight; the max load.
__global__ void moe_aux_kernel(Device::MoeRouting r, const int32_t* routed,
                               const double* mean_prob) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int E = r.experts, K = r.top_k;
  const int64_t group = r.group_tokens, groups = r.groups();
  double aux_sum = 0.0;
  for (int64_t g = 0; g < groups; ++g) {
    double aux = 0.0;
    for (int e = 0; e < E; ++e) {
      const double f = static_cast<double>(routed[g * E + e]) / static_cast<double>(group * K);
      aux = __dadd_rn(aux, __dmul_rn(f, mean_prob[g * E + e]) / static_cast<double>(group));
    }
    aux_sum = __dadd_rn(aux_sum, __dmul_rn(static_cast<double>(E), aux));
  }
  int64_t max_total = 0;
  for (int e = 0; e < E; ++e) {
    int64_t total = 0;
    for (int64_t g = 0; g < groups; ++g) total += routed[g * E + e];
    max_total = total > max_total ? total : max_total;
  }
  r.stats[0] = groups > 0
                   ? static_cast<float>(__dmul_rn(static_cast<double>(r.aux_loss_weight), aux_sum) /
                                        static_cast<double>(groups))
                   : 0.0f;
  r.stats[1] = r.tokens > 0 ? __fdiv_rn(static_cast<float>(max_total),
                                        static_cast<float>(r.tokens * K))
                            : 0.0f;
}

__global__ void moe_route_backward_kernel(Device::MoeRouting r, const float* dsend_weight,
                                          float* dprobs) {
  const int E = r.experts, K = r.top_k;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < r.tokens;
       t += stride) {
    const float* p = r.probs + t * E;
    float* dp = dprobs + t * E;
    const float* aux = r.aux_grad + (t / r.group_tokens) * E;
    for (int e = 0; e < E; ++e) dp[e] = aux[e];
    // w_j = p_j / S over the top-k: dL/dp_j = (dw_j - sum_k dw_k w_k) / S.
    float sum = 0.0f, dot = 0.0f;
    for (int k = 0; k < K; ++k) {
      const int64_t a = t * K + k;
      const float dw = r.slot[a] >= 0 ? dsend_weight[r.slot[a]] : 0.0f;
      sum = __fadd_rn(sum, p[r.chosen[a]]);
      dot = __fadd_rn(dot, __fmul_rn(dw, r.weight[a]));
    }
    for (int k = 0; k < K; ++k) {
      const int64_t a = t * K + k;
      const float dw = r.slot[a] >= 0 ? dsend_weight[r.slot[a]] : 0.0f;
      dp[r.chosen[a]] = __fadd_rn(dp[r.chosen[a]], __fdiv_rn(__fsub_rn(dw, dot), sum));
    }
  }
}

}  // namespace

void moe_route(cudaStream_t stream, cudaMemPool_t scratch_pool, const Device::MoeRouting& r) {
  const int64_t groups = r.groups();
  if (r.tokens > 0) {
    moe_top_k_kernel<<<blocks_for(std::max(r.tokens, r.experts * r.slots())), kThreads, 0,
                       stream>>>(r);
    FSDP_CUDA_CHECK_LAUNCH();
  }
  if (!r.stats && r.tokens == 0) return;
  PoolScratch scratch(stream, scratch_pool);
  auto* routed = scratch.get<int32_t>(static_cast<size_t>(std::max<int64_t>(groups * r.experts, 1)));
  auto* mean_prob = scratch.get<double>(static_cast<size_t>(std::max<int64_t>(groups * r.experts, 1)));
  if (r.tokens > 0) {
    moe_assign_kernel<<<r.experts, kExpertThreads, 0, stream>>>(r, routed, mean_prob);
    FSDP_CUDA_CHECK_LAUNCH();
  }
  if (r.stats) {
    moe_aux_kernel<<<1, 32, 0, stream>>>(r, routed, mean_prob);
    FSDP_CUDA_CHECK_LAUNCH();
  }
}

void moe_route_backward(cudaStream_t stream, const Device::MoeRouting& r,
                        const float* dsend_weight, float* dprobs) {
  if (r.tokens <= 0) return;
  moe_route_backward_kernel<<<blocks_for(r.tokens), kThreads, 0, stream>>>(r, dsend_weight,
                                                                          dprobs);
  FSDP_CUDA_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
