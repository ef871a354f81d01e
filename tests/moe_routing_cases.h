// Random routing cases for Device::moe_route and moe_route_backward (Note [Device MoE
// routing]), and a run of both ops on any device: the CPU backend's against the host routing
// (tests/test_moe_device_routing.cpp), the CUDA backend's against the CPU's
// (tests/gpu/test_cuda_moe.cpp).
#pragma once

#include <algorithm>
#include <random>
#include <vector>

#include "fsdp/device.h"
#include "fsdp/nn/moe.h"
#include "fsdp/tensor.h"

namespace fsdp::moe_routing_test {

struct Case {
  int experts = 1, top_k = 1;
  int64_t group = 1, groups = 1;
  double capacity_factor = 1;
  float aux_loss_weight = 0.01f;
  std::vector<float> probs;  // [tokens, experts]
  int64_t tokens() const { return group * groups; }
};

// Rows that sum to 1. Most rows are small integers over their sum, so equal probabilities
// (ties inside a row) are common; the others are continuous. A skew towards low experts makes
// them overflow their capacity. Up to max_experts experts and max_group tokens per group.
inline Case make_case(std::mt19937& rng, int max_experts = 9, int64_t max_group = 12) {
  Case c;
  c.experts = std::uniform_int_distribution<int>(1, max_experts)(rng);
  c.top_k = std::uniform_int_distribution<int>(1, c.experts)(rng);
  c.group = std::uniform_int_distribution<int64_t>(1, max_group)(rng);
  c.groups = std::uniform_int_distribution<int64_t>(1, 3)(rng);
  const double factors[] = {0.25, 0.5, 1.0, 1.25, 2.0};
  c.capacity_factor = factors[std::uniform_int_distribution<int>(0, 4)(rng)];
  c.aux_loss_weight = std::uniform_int_distribution<int>(0, 1)(rng) ? 0.01f : 0.37f;
  std::uniform_int_distribution<int> small(0, 3);
  std::uniform_real_distribution<float> real(0.0f, 1.0f);
  for (int64_t t = 0; t < c.tokens(); ++t) {
    const bool ties = std::uniform_int_distribution<int>(0, 3)(rng) != 0;
    std::vector<float> row(static_cast<size_t>(c.experts));
    float sum = 0;
    for (int e = 0; e < c.experts; ++e) {
      row[e] = ties ? static_cast<float>(small(rng) + (e == 0 ? 1 : 0)) : real(rng) + 1.0f / (e + 1);
      sum += row[e];
    }
    for (float& v : row) c.probs.push_back(v / sum);
  }
  return c;
}

struct Routed {
  std::vector<int32_t> chosen, slot, send_assignment, send_token;
  std::vector<float> weight, send_weight, aux_grad, stats, dprobs;
};

template <typename T>
inline T* upload(Device& d, Stream s, std::vector<Tensor>& keep, const std::vector<T>& v, DType t) {
  keep.push_back(empty_tensor(d, s, t, static_cast<int64_t>(std::max<size_t>(v.size(), 1)), 1,
                              MemTag::Activation));
  if (!v.empty()) d.copy_from_host(s, keep.back().data, v.data(), v.size() * sizeof(T));
  return keep.back().as<T>();
}

template <typename T>
inline std::vector<T> download(Device& d, Stream s, const T* p, int64_t n) {
  std::vector<T> out(static_cast<size_t>(n));
  if (n > 0) d.copy_to_host(s, out.data(), p, out.size() * sizeof(T));
  d.synchronize_stream(s);
  return out;
}

// The device routing of `c`, then its backward for the weights' gradients `dsend_weight`.
inline Routed route_on_device(Device& d, Stream s, const Case& c, int64_t capacity,
                       const std::vector<float>& dsend_weight) {
  std::vector<Tensor> keep;
  Device::MoeRouting r;
  r.tokens = c.tokens();
  r.experts = c.experts;
  r.top_k = c.top_k;
  r.group_tokens = c.group;
  r.capacity = capacity;
  r.aux_loss_weight = c.aux_loss_weight;
  const int64_t assignments = r.tokens * c.top_k, rows = c.experts * r.slots();
  r.probs = upload(d, s, keep, c.probs, DType::F32);
  auto ints = [&](int64_t n) { return upload(d, s, keep, std::vector<int32_t>(n, 7), DType::I32); };
  auto floats = [&](int64_t n) { return upload(d, s, keep, std::vector<float>(n, 7.0f), DType::F32); };
  r.chosen = ints(assignments);  // junk first: every element must be written
  r.weight = floats(assignments);
  r.slot = ints(assignments);
  r.send_assignment = ints(rows);
  r.send_token = ints(rows);
  r.send_weight = floats(rows);
  r.aux_grad = floats(c.groups * c.experts);
  r.stats = floats(2);
  float* dprobs = floats(r.tokens * c.experts);
  d.moe_route(s, r);
  d.moe_route_backward(s, r, upload(d, s, keep, dsend_weight, DType::F32), dprobs);
  Routed out;
  out.chosen = download(d, s, r.chosen, assignments);
  out.weight = download(d, s, r.weight, assignments);
  out.slot = download(d, s, r.slot, assignments);
  out.send_assignment = download(d, s, r.send_assignment, rows);
  out.send_token = download(d, s, r.send_token, rows);
  out.send_weight = download(d, s, r.send_weight, rows);
  out.aux_grad = download(d, s, r.aux_grad, c.groups * c.experts);
  out.stats = download(d, s, r.stats, 2);
  out.dprobs = download(d, s, dprobs, r.tokens * c.experts);
  return out;
}

// The host routing's settings for a case.
inline nn::MoeConfig config_of(const Case& c) {
  nn::MoeConfig config;
  config.experts = c.experts;
  config.top_k = c.top_k;
  config.expert_ffn_dim = 1;
  config.capacity_factor = c.capacity_factor;
  config.aux_loss_weight = c.aux_loss_weight;
  config.group_tokens = c.group;
  return config;
}

}  // namespace fsdp::moe_routing_test
