// Note [Device MoE routing]: the CPU backend's Device::moe_route and moe_route_backward must
// give, to the bit, what the host routing gives with a capacity factor (route_tokens and
// ExpertDispatcher::plan, the reference the layer used before routing moved to the device), for
// random probabilities with ties, many expert counts, top-k, group sizes and capacities, with
// assignments dropped over capacity.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/nn/moe.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

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
// them overflow their capacity.
Case make_case(std::mt19937& rng) {
  Case c;
  c.experts = std::uniform_int_distribution<int>(1, 9)(rng);
  c.top_k = std::uniform_int_distribution<int>(1, c.experts)(rng);
  c.group = std::uniform_int_distribution<int64_t>(1, 12)(rng);
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
T* upload(Device& d, Stream s, std::vector<Tensor>& keep, const std::vector<T>& v, DType t) {
  keep.push_back(empty_tensor(d, s, t, static_cast<int64_t>(std::max<size_t>(v.size(), 1)), 1,
                              MemTag::Activation));
  if (!v.empty()) d.copy_from_host(s, keep.back().data, v.data(), v.size() * sizeof(T));
  return keep.back().as<T>();
}

template <typename T>
std::vector<T> download(Device& d, Stream s, const T* p, int64_t n) {
  std::vector<T> out(static_cast<size_t>(n));
  if (n > 0) d.copy_to_host(s, out.data(), p, out.size() * sizeof(T));
  d.synchronize_stream(s);
  return out;
}

// The device routing of `c`, then its backward for the weights' gradients `dsend_weight`.
Routed route_on_device(Device& d, Stream s, const Case& c, int64_t capacity,
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

// The router gradient from the host's plan (what the layer computed on the host): each
// assignment's weight gradient is its sent row's, 0 when dropped.
std::vector<float> host_router_grad(const Case& c, const nn::RoutePlan& plan,
                                    const std::vector<int32_t>& send_order,
                                    const std::vector<float>& dsend_weight) {
  const int E = c.experts, K = c.top_k;
  std::vector<float> dw(static_cast<size_t>(c.tokens() * K), 0.0f);
  for (size_t i = 0; i < send_order.size(); ++i)
    if (send_order[i] >= 0) dw[send_order[i]] = dsend_weight[i];
  std::vector<float> dprobs(static_cast<size_t>(c.tokens() * E));
  for (int64_t t = 0; t < c.tokens(); ++t) {
    const float* p = c.probs.data() + t * E;
    float* dp = dprobs.data() + t * E;
    for (int e = 0; e < E; ++e) dp[e] = plan.aux_grad[(t / c.group) * E + e];
    float sum = 0, dot = 0;
    for (int k = 0; k < K; ++k) {
      sum += p[plan.chosen[t * K + k]];
      dot += dw[t * K + k] * plan.weight[t * K + k];
    }
    for (int k = 0; k < K; ++k) dp[plan.chosen[t * K + k]] += (dw[t * K + k] - dot) / sum;
  }
  return dprobs;
}

TEST(MoeDeviceRouting, CpuOpEqualsTheHostRoutingAndDispatchPlanBitwise) {
  int cases = 0, dropped = 0, tied = 0;
  runtime::run_cpu_ranks(1, {}, [&](int, Device& device, std::shared_ptr<Comm>) {
    const Stream s = device.create_stream("s", StreamPriority::Normal);
    RunContext ctx{&device, s, DType::F32};
    std::mt19937 rng(20261201);
    for (int i = 0; i < 400; ++i, ++cases) {
      const Case c = make_case(rng);
      nn::MoeConfig config;
      config.experts = c.experts;
      config.top_k = c.top_k;
      config.expert_ffn_dim = 1;
      config.capacity_factor = c.capacity_factor;
      config.aux_loss_weight = c.aux_loss_weight;
      config.group_tokens = c.group;
      const nn::RoutePlan plan = nn::route_tokens(c.probs, c.tokens(), config);
      ASSERT_GT(plan.capacity, 0);
      ASSERT_EQ(plan.capacity, config.capacity(c.group));
      nn::ExpertDispatcher dispatcher;
      dispatcher.plan(ctx, nullptr, c.experts, plan.expert, plan.capacity * c.groups);
      const std::vector<int32_t>& order = dispatcher.send_assignments();
      std::vector<float> dsend_weight(order.size());
      for (float& v : dsend_weight) v = std::uniform_real_distribution<float>(-1, 1)(rng);

      const Routed got = route_on_device(device, s, c, plan.capacity, dsend_weight);
      SCOPED_TRACE(::testing::Message() << "case " << i << ": E " << c.experts << " K " << c.top_k
                                      << " group " << c.group << " x " << c.groups << " cf "
                                      << c.capacity_factor);
      EXPECT_EQ(got.chosen, plan.chosen);
      EXPECT_EQ(got.weight, plan.weight);
      EXPECT_EQ(got.send_assignment, order);
      std::vector<int32_t> slot(plan.expert.size(), -1), token(order.size());
      std::vector<float> weight(order.size());
      for (size_t row = 0; row < order.size(); ++row) {
        if (order[row] >= 0) slot[order[row]] = static_cast<int32_t>(row);
        token[row] = order[row] >= 0 ? order[row] / c.top_k : static_cast<int32_t>(c.tokens());
        weight[row] = order[row] >= 0 ? plan.weight[order[row]] : 0.0f;
      }
      EXPECT_EQ(got.slot, slot);
      EXPECT_EQ(got.send_token, token);
      EXPECT_EQ(got.send_weight, weight);
      EXPECT_EQ(got.aux_grad, plan.aux_grad);
      EXPECT_EQ(got.stats, (std::vector<float>{plan.aux_loss, plan.max_load}));
      EXPECT_EQ(got.dprobs, host_router_grad(c, plan, order, dsend_weight));
      if (::testing::Test::HasFailure()) return;
      dropped += std::count(plan.expert.begin(), plan.expert.end(), -1) > 0;
      for (int64_t t = 0; t < c.tokens(); ++t) {
        const float* p = c.probs.data() + t * c.experts;
        const float kth = p[plan.chosen[t * c.top_k + c.top_k - 1]];
        tied += c.top_k < c.experts &&
                std::count(p, p + c.experts, kth) > 1;  // the k-th pick broke a tie
      }
    }
  });
  EXPECT_EQ(cases, 400);
  EXPECT_GT(dropped, 100) << "too few cases drop assignments over capacity";
  EXPECT_GT(tied, 100) << "too few tokens break ties";
}

TEST(MoeDeviceRouting, BadShapesAreOneLineErrors) {
  runtime::run_cpu_ranks(1, {}, [&](int, Device& device, std::shared_ptr<Comm>) {
    const Stream s = device.create_stream("s", StreamPriority::Normal);
    Device::MoeRouting r;
    r.tokens = 6;
    r.experts = 4;
    r.top_k = 2;
    r.group_tokens = 4;  // 6 tokens do not split into groups of 4
    r.capacity = 2;
    try {
      device.moe_route(s, r);
      FAIL() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("6 tokens in groups of 4"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace fsdp::testing
