// The MoE layer's capacity-factor routing on the CPU backend (Note [Device MoE routing] in
// include/fsdp/device.h). The loops are the host routing's (route_tokens and
// ExpertDispatcher::plan in src/nn/moe_transformer_routing.cpp), in the same order and with the
// same arithmetic, so the two agree to the bit; the tests hold them to it.
#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_device.h"
#include "backend/op_checks.h"
#include "fsdp/error.h"
#include "fsdp/moe_top_k.h"

namespace fsdp::cpu {

namespace {

void route(const Device::MoeRouting& r) {
  const int E = r.experts, K = r.top_k;
  const int64_t T = r.tokens, group = r.group_tokens, groups = r.groups(), slots = r.slots();
  for (int64_t i = 0; i < E * slots; ++i) {
    r.send_assignment[i] = -1;
    r.send_token[i] = static_cast<int32_t>(T);
    r.send_weight[i] = 0.0f;
  }
  std::vector<int64_t> total(static_cast<size_t>(E), 0), sent(static_cast<size_t>(E), 0);
  std::vector<int> order(static_cast<size_t>(E));
  double aux_sum = 0;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<int64_t> routed(static_cast<size_t>(E), 0), kept(static_cast<size_t>(E), 0);
    std::vector<double> mean_prob(static_cast<size_t>(E), 0.0);
    for (int64_t t = g * group; t < (g + 1) * group; ++t) {
      const float* p = r.probs + t * E;
      for (int e = 0; e < E; ++e) mean_prob[e] += p[e];
      const float sum = moe_top_k(p, K, order);
      for (int k = 0; k < K; ++k) {
        const int e = order[k];
        const int64_t a = t * K + k;
        r.chosen[a] = e;
        r.weight[a] = p[e] / sum;
        ++routed[e];
        r.slot[a] = -1;
        if (kept[e] >= r.capacity) continue;
        const int64_t row = e * slots + sent[e];
        r.slot[a] = static_cast<int32_t>(row);
        r.send_assignment[row] = static_cast<int32_t>(a);
        r.send_token[row] = static_cast<int32_t>(t);
        r.send_weight[row] = r.weight[a];
        ++kept[e];
        ++sent[e];
      }
    }
    double aux = 0;
    for (int e = 0; e < E; ++e) {
      const double f = static_cast<double>(routed[e]) / static_cast<double>(group * K);
      aux += f * mean_prob[e] / static_cast<double>(group);
      r.aux_grad[g * E + e] = static_cast<float>(
          r.aux_loss_weight * E * f / (static_cast<double>(group) * static_cast<double>(groups)));
      total[e] += routed[e];
    }
    aux_sum += E * aux;
  }
  if (!r.stats) return;
  r.stats[0] = groups > 0 ? static_cast<float>(r.aux_loss_weight * aux_sum / groups) : 0.0f;
  r.stats[1] = T > 0 ? static_cast<float>(*std::max_element(total.begin(), total.end())) /
                           static_cast<float>(T * K)
                     : 0.0f;
}

void route_backward(const Device::MoeRouting& r, const float* dsend_weight, float* dprobs) {
  const int E = r.experts, K = r.top_k;
  for (int64_t t = 0; t < r.tokens; ++t) {
    const float* p = r.probs + t * E;
    float* dp = dprobs + t * E;
    const float* aux = r.aux_grad + (t / r.group_tokens) * E;
    for (int e = 0; e < E; ++e) dp[e] = aux[e];
    // w_j = p_j / S over the top-k: dL/dp_j = (dw_j - sum_k dw_k w_k) / S.
    float sum = 0, dot = 0;
    for (int k = 0; k < K; ++k) {
      const int64_t a = t * K + k;
      const float dw = r.slot[a] >= 0 ? dsend_weight[r.slot[a]] : 0.0f;
      sum += p[r.chosen[a]];
      dot += dw * r.weight[a];
    }
    for (int k = 0; k < K; ++k) {
      const int64_t a = t * K + k;
      const float dw = r.slot[a] >= 0 ? dsend_weight[r.slot[a]] : 0.0f;
      dp[r.chosen[a]] += (dw - dot) / sum;
    }
  }
}

}  // namespace

void CpuDevice::moe_route(Stream s, const MoeRouting& r) {
  backend::check_moe_routing(r, "moe_route");
  if (r.tokens == 0 && !r.stats) return;
  enqueue(s, OpKind::Kernel, [r] { route(r); });
}

void CpuDevice::moe_route_backward(Stream s, const MoeRouting& r, const float* dsend_weight,
                                   float* dprobs) {
  const char* op = "moe_route_backward";
  backend::check_moe_routing(r, op);
  if (r.tokens == 0) return;
  backend::check_ptr(dprobs, "dprobs", op);
  backend::check_ptr(dsend_weight, "dsend_weight", op);
  enqueue(s, OpKind::Kernel, [=] { route_backward(r, dsend_weight, dprobs); });
}

}  // namespace fsdp::cpu
