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
#include "moe_routing_cases.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

using moe_routing_test::Case;
using moe_routing_test::config_of;
using moe_routing_test::make_case;
using moe_routing_test::route_on_device;
using moe_routing_test::Routed;

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
      const nn::MoeConfig config = config_of(c);
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

// With a capacity the exchange's layout follows from the shapes: plan_static (built once, then
// kept) moves rows exactly as plan() does from the host's assignment list, both ways.
class MoeStaticDispatch : public ::testing::TestWithParam<int> {};

TEST_P(MoeStaticDispatch, LayoutFromShapesMovesRowsAsTheHostPlanDoes) {
  const int world = GetParam(), experts = 6, tokens = 7, K = 2, dim = 2;
  const int64_t slots = 3;
  runtime::run_cpu_ranks(world, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    const Stream s = device.create_stream("s", StreamPriority::Normal);
    RunContext ctx{&device, s, DType::F32};
    std::vector<int32_t> assignment(tokens * K);  // at most `slots` per expert, some dropped
    std::vector<int> per_expert(experts, 0);
    for (int a = 0; a < tokens * K; ++a) {
      const int e = (a * 5 + rank) % (experts + 1);
      assignment[a] = e < experts && per_expert[e] < slots ? e : -1;
      if (assignment[a] >= 0) ++per_expert[e];
    }
    nn::ExpertDispatcher host, shapes;
    host.plan(ctx, comm.get(), experts, assignment, slots);
    std::vector<float> rows(static_cast<size_t>(experts * slots * dim));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(rank * 1000 + i);
    Tensor send = empty_tensor(device, s, DType::F32, experts * slots, dim, MemTag::Activation);
    device.copy_from_host(s, send.data, rows.data(), rows.size() * sizeof(float));
    auto there_and_back = [&](const nn::ExpertDispatcher& d) {
      Tensor there = d.to_experts(ctx, send, dim);
      Tensor back = d.from_experts(ctx, there, dim);
      std::vector<float> out(static_cast<size_t>((there.rows + back.rows) * dim));
      device.copy_to_host(s, out.data(), there.data, there.bytes());
      device.copy_to_host(s, out.data() + there.numel(), back.data, back.bytes());
      device.synchronize_stream(s);
      return out;
    };
    const std::vector<float> want = there_and_back(host);
    for (int pass = 0; pass < 2; ++pass) {  // the second pass reuses the kept layout
      shapes.plan_static(ctx, comm.get(), experts, slots);
      EXPECT_EQ(shapes.sent_rows(), host.sent_rows()) << "rank " << rank;
      EXPECT_EQ(shapes.received_rows(), host.received_rows()) << "rank " << rank;
      EXPECT_EQ(shapes.local_counts(), host.local_counts()) << "rank " << rank;
      EXPECT_EQ(there_and_back(shapes), want) << "rank " << rank << " pass " << pass;
    }
    send = Tensor{};
    host = shapes = nn::ExpertDispatcher{};
    device.synchronize();
  });
}

INSTANTIATE_TEST_SUITE_P(EpSizes, MoeStaticDispatch, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "ep" + std::to_string(info.param); });

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
