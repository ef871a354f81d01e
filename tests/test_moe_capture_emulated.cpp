// The MoE transformer's captured steps (Note [Captured steps]) on CPU ranks, through the
// CUDA-graph emulator of graph_emulator.h. With a capacity factor the routing runs on the
// device (Note [Device MoE routing]) and nothing in a step waits for the host, so the step
// recorded once and replayed must train bitwise as the eager steps do, with and without expert
// parallelism and micro-batches; dropless routing cannot be captured and is refused in one line.
#include <gtest/gtest.h>

#include <string>

#include "captured_run.h"

namespace fsdp::testing {
namespace {

// Four blocks, two of them MoE (their aux losses add up on the device), four experts of top 2
// at capacity factor 1: some assignments are dropped at every step.
runtime::TrainConfig moe_with_capacity(int ep, int micro_batches) {
  runtime::TrainConfig c = tiny_moe_transformer_config(ep, /*experts=*/4, /*steps=*/7);
  c.model.layers = 4;
  c.model.capacity_factor = 1.0;
  c.micro_batches = micro_batches;
  c.warmup = 2;
  c.optimizer.max_grad_norm = 1.0f;
  c.schedule.kind = "cosine";  // a different lr at every replayed step
  c.schedule.warmup_steps = 2;
  c.schedule.min_lr = 1e-4f;
  return c;
}

struct Layout {
  int world, ep, micro_batches;
};

class MoeCaptureEmulated : public ::testing::TestWithParam<Layout> {};

TEST_P(MoeCaptureEmulated, CapacityFactorReplaysBitwiseAsEager) {
  const auto [world, ep, micro_batches] = GetParam();
  const runtime::TrainConfig c = moe_with_capacity(ep, micro_batches);
  const auto eager = run_fsdp(world, c);
  const CapturedRun graph = run_captured(world, c);
  for (int r = 0; r < world; ++r) {
    const runtime::RankResult& g = graph.ranks[r];
    EXPECT_EQ(g.captured_step, c.warmup) << "rank " << r;
    EXPECT_EQ(graph.replays[r], c.steps - c.warmup) << "rank " << r;
    EXPECT_EQ(g.graph_streams,
              (std::vector<std::string>{"compute", "all-gather", "reduce-scatter"}));
    ASSERT_EQ(g.losses.size(), static_cast<size_t>(c.steps));
    EXPECT_EQ(g.losses, eager[r].losses) << "rank " << r;
    EXPECT_EQ(g.grad_norms, eager[r].grad_norms) << "rank " << r;
    EXPECT_EQ(g.lrs, eager[r].lrs) << "rank " << r;
    EXPECT_EQ(g.params, eager[r].params) << "rank " << r;
    // The max load is read from device memory after each step, replayed ones included.
    EXPECT_EQ(g.max_expert_loads, eager[r].max_expert_loads) << "rank " << r;
    for (double load : g.max_expert_loads) {
      EXPECT_GE(load, 0.25);  // four experts: the busiest has at least a quarter
      EXPECT_LE(load, 1.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeCaptureEmulated,
                         ::testing::Values(Layout{2, 2, 1}, Layout{2, 2, 2}, Layout{2, 1, 1},
                                           Layout{2, 1, 2}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.world) + "_ep" +
                                  std::to_string(info.param.ep) + "_mb" +
                                  std::to_string(info.param.micro_batches);
                         });

TEST(MoeCaptureEmulatedRefusal, DroplessRoutingIsRefusedInOneLine) {
  runtime::TrainConfig c = moe_with_capacity(2, 1);
  c.model.capacity_factor = 0;
  try {
    run_captured(2, c);
    FAIL() << "dropless routing was captured";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("dropless routing"), std::string::npos) << what;
    EXPECT_NE(what.find("capacity_factor > 0 routes on the device and captures"),
              std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace fsdp::testing
