// Note [Symmetric collectives]: a unit that gets no gradient on some ranks, or sits out a
// whole step, leaves every rank issuing the same collectives, and training matches an
// unsharded reference in which those ranks contribute zero grads for it.
#include <gtest/gtest.h>

#include "test_fsdp_loop.h"

namespace fsdp::testing {
namespace {

struct SkipCase {
  int world;
  int skipper;
  bool reshard;
};

std::string skip_case_name(const ::testing::TestParamInfo<SkipCase>& info) {
  return "world" + std::to_string(info.param.world) + "_skipper" +
         std::to_string(info.param.skipper) + (info.param.reshard ? "_reshard" : "_noReshard");
}

void PrintTo(const SkipCase& c, std::ostream* os) { *os << skip_case_name({c, 0}); }

std::vector<SkipCase> skip_cases() {
  std::vector<SkipCase> out;
  for (int world : {2, 3, 4})
    for (int skipper = 0; skipper < world; ++skipper)
      for (bool reshard : {false, true}) out.push_back({world, skipper, reshard});
  return out;
}

void expect_same_collectives_on_every_rank(const LoopResult& r) {
  for (size_t rank = 1; rank < r.issued.size(); ++rank)
    EXPECT_EQ(r.issued[rank], r.issued[0]) << "rank " << rank << " issued other collectives";
}

class SkippedUnit : public ::testing::TestWithParam<SkipCase> {};

// Two units under a root with a head; one rank runs backward through `a` only. Before the
// fix the run hung: the other ranks reduce-scattered `b` and the skipper never did.
TEST_P(SkippedUnit, EveryRankIssuesTheSameCollectivesAndTrainingMatchesTheReference) {
  const SkipCase c = GetParam();
  const ModelFactory make = [&] {
    auto m = std::make_unique<BranchModel>(9);  // 9 rows: padded on 2, 4 ranks
    m->skip_rank = c.skipper;
    return m;
  };
  LoopOptions o;
  o.world = c.world;
  o.reshard_after_forward = c.reshard;
  const LoopResult got = run_sharded_loop(make, o);
  const LoopResult ref = run_reference_loop(make, o);
  expect_same_collectives_on_every_rank(got);
  // `b` is reduce-scattered in every step, on every rank: the skipper's share is zeros.
  EXPECT_EQ(got.issued[0][static_cast<int>(CollectiveKind::ReduceScatter)], 3 * o.steps);
  expect_matches_reference(got, ref, 1e-6, skip_case_name({c, 0}));
}

INSTANTIATE_TEST_SUITE_P(Ranks, SkippedUnit, ::testing::ValuesIn(skip_cases()), skip_case_name);

// The same with reduce-scatters on their own communicator: the order must match across both
// communicators too, or the ranks wait on each other's streams (a cross-communicator
// deadlock, which no single communicator's order check sees).
TEST(SkippedUnitSeparateRsGroup, BothCommunicatorsSeeTheSameOrder) {
  for (int skipper : {0, 2}) {
    const ModelFactory make = [=] {
      auto m = std::make_unique<BranchModel>(9);
      m->skip_rank = skipper;
      return m;
    };
    LoopOptions o;
    o.world = 3;
    o.reshard_after_forward = true;
    o.rs_max_input_buffers = 2;
    o.customize = [](LoopModel&, FsdpModule& root) { root.set_separate_reduce_scatter_group(true); };
    const LoopResult got = run_sharded_loop(make, o);
    expect_same_collectives_on_every_rank(got);
    expect_matches_reference(got, run_reference_loop(make, o), 1e-6, "skipper " + std::to_string(skipper));
  }
}

// No rank runs b's backward: b is still reduce-scattered (zeros) by every rank.
TEST(UnusedUnit, UnusedInBackwardOnEveryRankReducesZeros) {
  const ModelFactory make = [] {
    auto m = std::make_unique<BranchModel>(8);
    m->b_in_backward = false;
    return m;
  };
  LoopOptions o;
  o.world = 3;
  const LoopResult got = run_sharded_loop(make, o);
  expect_same_collectives_on_every_rank(got);
  EXPECT_EQ(got.issued[0][static_cast<int>(CollectiveKind::ReduceScatter)], 3 * o.steps);
  expect_matches_reference(got, run_reference_loop(make, o), 1e-6, "b unused in backward");
}

// b runs (forward and backward) on even steps only: on odd steps its grad shard must read as
// zeros for the optimizer (Note [Lazy zero grad]: finalize materializes them), not as the
// previous step's grads nor as fresh memory.
TEST(UnusedUnit, UnitSittingOutAWholeStepGetsZeroGrads) {
  const ModelFactory make = [] {
    auto m = std::make_unique<BranchModel>(8);
    m->b_every_step = false;
    return m;
  };
  for (bool host_sync : {true, false}) {
    LoopOptions o;
    o.world = 2;
    o.steps = 4;
    o.host_sync_every_step = host_sync;
    const LoopResult got = run_sharded_loop(make, o);
    expect_same_collectives_on_every_rank(got);
    // a and the head every step; b on steps 0 and 2.
    EXPECT_EQ(got.issued[0][static_cast<int>(CollectiveKind::ReduceScatter)], 2 * 4 + 2);
    expect_matches_reference(got, run_reference_loop(make, o), 1e-6,
                             host_sync ? "host sync" : "back to back");
  }
}

// The skipping rank changes from step to step, under random stream delays.
TEST(SkippedUnitChaos, SkipperChangesEveryStep) {
  class Rotating : public BranchModel {
   public:
    Rotating() : BranchModel(9) {}
    void configure(int rank, int step, int mb) override {
      skip_rank = step % 3;
      BranchModel::configure(rank, step, mb);
    }
  };
  const ModelFactory make = [] { return std::make_unique<Rotating>(); };
  LoopOptions o;
  o.world = 3;
  o.steps = 4;
  const LoopResult ref = run_reference_loop(make, o);
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    o.cpu.chaos = true;
    o.cpu.chaos_seed = seed;
    o.cpu.chaos_max_us = 100;
    o.reshard_after_forward = seed % 2 == 0;
    const LoopResult got = run_sharded_loop(make, o);
    expect_same_collectives_on_every_rank(got);
    expect_matches_reference(got, ref, 1e-6, "seed " + std::to_string(seed));
  }
}

}  // namespace
}  // namespace fsdp::testing
