// Invariant 6: with a separate RS communicator, an RS of layer i runs at the same time as
// the AG of layer i-1; with one shared communicator they never overlap.
#include <gtest/gtest.h>

#include "test_util.h"

namespace fsdp::testing {
namespace {

struct Interval {
  double start, end;
};

// Collective ops on rank 0's timeline with this exact label.
std::vector<Interval> collectives(const Timeline& t, const std::string& label) {
  std::vector<Interval> out;
  for (const TimelineOp& op : t.ops)
    if (op.kind == OpKind::Collective && op.label == label) out.push_back({op.start_us, op.end_us});
  return out;
}

// How many (RS layers.i, AG layers.{i-1}) pairs ran at the same time; and any RS/AG overlap.
std::pair<int, int> overlaps(const Timeline& t, int layers) {
  int neighbour = 0, any = 0;
  for (int i = 0; i < layers; ++i)
    for (int j = 0; j < layers; ++j)
      for (const Interval& rs : collectives(t, "RS layers." + std::to_string(i)))
        for (const Interval& ag : collectives(t, "AG layers." + std::to_string(j)))
          if (rs.start < ag.end && ag.start < rs.end) {
            ++any;
            neighbour += j == i - 1;
          }
  return {neighbour, any};
}

runtime::TrainConfig overlap_config(bool separate) {
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 6;
  c.model.dim = 256;  // small compute (4 tokens) under a slow simulated link: AG(i-1) is
  c.tokens = 4;       // still on the wire when RS(i) starts
  c.steps = 3;
  c.warmup = 1;
  c.timeline = true;
  c.separate_rs_group = separate;
  return c;
}

cpu::CpuOptions slow_link() {
  cpu::CpuOptions o;
  o.link_gbps = 0.2;  // a 256 KiB all-gather takes ~0.65 ms on the wire
  return o;
}

TEST(Overlap, SeparateGroupLetsRsRunUnderThePreviousLayersAg) {
  auto r = run_fsdp(2, overlap_config(true), slow_link());
  auto [neighbour, any] = overlaps(r[0].timeline, 6);
  EXPECT_GT(neighbour, 0) << any << " RS/AG overlaps in all";
}

TEST(Overlap, SharedCommunicatorNeverOverlapsRsAndAg) {
  auto r = run_fsdp(2, overlap_config(false), slow_link());
  ASSERT_FALSE(collectives(r[0].timeline, "RS layers.3").empty());
  EXPECT_EQ(overlaps(r[0].timeline, 6).second, 0);
}

}  // namespace
}  // namespace fsdp::testing

namespace fsdp::testing {
namespace {

// The data needs no gradient, so the first block's backward issues no dX GEMM.
TEST(Schedule, FirstBlockSkipsTheInputGradient) {
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 3;
  c.model.dim = 16;
  c.tokens = 4;
  c.steps = 2;
  c.warmup = 1;
  c.timeline = true;
  const auto ranks = run_fsdp(2, c);
  const Timeline& t = ranks[0].timeline;
  auto count = [&](const std::string& label) {
    int n = 0;
    for (const TimelineOp& op : t.ops) n += op.label == label && op.kind != OpKind::Wait;
    return n;
  };
  EXPECT_EQ(count("bwd layers.0 gemm dX"), 0);
  EXPECT_EQ(count("bwd layers.1 gemm dX"), 1);
  EXPECT_EQ(count("bwd layers.0 gemm dW"), 1);
}

}  // namespace
}  // namespace fsdp::testing
