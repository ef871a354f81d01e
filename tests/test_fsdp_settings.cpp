// The FsdpModule settings, each asserted by what it changes: collectives issued, what stays
// alive between backwards, and parity with the unsharded reference.
#include <gtest/gtest.h>

#include "test_fsdp_loop.h"

namespace fsdp::testing {
namespace {

int64_t issued(const LoopResult& r, CollectiveKind k) { return r.issued[0][static_cast<int>(k)]; }

ModelFactory chain(int layers, int64_t dim) {
  return [=] { return std::make_unique<ChainModel>(layers, dim); };
}

// Gradient accumulation over two micro-batches with the units kept gathered in between: the
// second micro-batch gathers nothing, and finalize of the last backward reshards.
TEST(ReshardAfterBackward, FalseKeepsUnitsGatheredForTheNextMicroBatch) {
  for (bool keep : {false, true}) {
    LoopOptions o;
    o.micro_batches = 2;
    o.reshard_after_forward = false;
    o.before_forward = [keep](LoopModel&, FsdpModule& root, int, int mb) {
      root.set_reshard_after_backward(!(keep && mb == 0));
    };
    const LoopResult got = run_sharded_loop(chain(3, 12), o);
    // Each micro-batch's forward gathers the 3 units unless the last backward kept them.
    EXPECT_EQ(issued(got, CollectiveKind::AllGather), (keep ? 3 : 6) * o.steps) << keep;
    expect_matches_reference(got, run_reference_loop(chain(3, 12), o), 1e-6, keep ? "kept" : "resharded");
  }
}

// With is_last_backward false the root's finalize leaves the RS ring alone (its buffer stays
// alive into the next micro-batch) and materializes nothing; the last backward drains it.
TEST(IsLastBackward, FalseLeavesTheRingToTheLastBackward) {
  for (bool last_only : {false, true}) {
    std::vector<int64_t> rs_bytes_before_forward;
    LoopOptions o;
    o.micro_batches = 3;
    o.sync_every_micro_batch = true;
    o.before_forward = [&, last_only](LoopModel&, FsdpModule& root, int, int mb) {
      root.set_is_last_backward(!last_only || mb == 2);
      if (root.state().mesh.rank() == 0)
        rs_bytes_before_forward.push_back(
            root.state().mesh.device().memory_stats().tag_bytes[static_cast<int>(MemTag::RsInput)]);
    };
    const LoopResult got = run_sharded_loop(chain(3, 12), o);
    ASSERT_EQ(rs_bytes_before_forward.size(), 9u);
    for (size_t i = 0; i < 9; ++i) {
      const bool after_a_non_last_backward = last_only && i % 3 != 0;
      EXPECT_EQ(rs_bytes_before_forward[i] > 0, after_a_non_last_backward) << "micro-batch " << i;
    }
    EXPECT_EQ(issued(got, CollectiveKind::ReduceScatter), 3 * 3 * o.steps);
    expect_matches_reference(got, run_reference_loop(chain(3, 12), o), 1e-6,
                             last_only ? "last only" : "every backward last");
  }
}

// Accumulation where only some units skip the sync on the first micro-batch: those reduce
// once (their accumulated grads), the others twice (into the same grad shard).
TEST(PartialSync, OnlyTheRootSkipsTheSync) {
  const ModelFactory make = [] { return std::make_unique<BranchModel>(9); };
  LoopOptions o;
  o.micro_batches = 2;
  o.sync_every_micro_batch = true;
  o.before_forward = [](LoopModel&, FsdpModule& root, int, int mb) {
    if (mb == 0) root.set_requires_gradient_sync(false, /*recurse=*/false);
  };
  const LoopResult got = run_sharded_loop(make, o);
  EXPECT_EQ(issued(got, CollectiveKind::ReduceScatter), (2 + 2 + 1) * o.steps);  // a, b twice; root once
  expect_matches_reference(got, run_reference_loop(make, o), 1e-6, "root skips");
}

TEST(PartialSync, OnlySomeBlocksSkipTheSync) {
  LoopOptions o;
  o.micro_batches = 3;
  o.sync_every_micro_batch = true;
  o.before_forward = [](LoopModel& m, FsdpModule&, int, int mb) {
    if (mb == 2) return;
    for (int i : {0, 2}) fsdp_module_of(*m.units()[i])->set_requires_gradient_sync(false);
  };
  const LoopResult got = run_sharded_loop(chain(4, 12), o);
  EXPECT_EQ(issued(got, CollectiveKind::ReduceScatter), (2 * 1 + 2 * 3) * o.steps);
  expect_matches_reference(got, run_reference_loop(chain(4, 12), o), 1e-6, "blocks 0, 2 skip");
}

// FSDP2: set_reduce_scatter_max_input_buffers takes effect at the next backward, also after
// lazy init and also when called on a unit below the root.
void expect_rs_buffers_take_effect(bool via_unit) {
  const int layers = 5;
  std::vector<int64_t> peak_live;  // RsInput buffers alive at once, per step, rank 0
  LoopOptions o;
  o.steps = 3;
  o.before_forward = [&](LoopModel& m, FsdpModule& root, int step, int) {
    Device& d = root.state().mesh.device();
    if (step > 0 && root.state().mesh.rank() == 0)
      peak_live.push_back(d.memory_stats().tag_peak_live[static_cast<int>(MemTag::RsInput)]);
    if (step == 1) {
      if (via_unit) fsdp_module_of(*m.units()[2])->set_reduce_scatter_max_input_buffers(3, false);
      else root.set_reduce_scatter_max_input_buffers(3);
      EXPECT_EQ(root.reduce_scatter_max_input_buffers(), 3);
    }
    d.reset_peak_memory();
  };
  const LoopResult got = run_sharded_loop(chain(layers, 12), o);
  peak_live.push_back(got.memory[0].tag_peak_live[static_cast<int>(MemTag::RsInput)]);
  EXPECT_EQ(peak_live, (std::vector<int64_t>{1, 3, 3})) << (via_unit ? "via a unit" : "via the root");
}

TEST(RsMaxInputBuffers, SetOnTheRootAfterTheFirstForwardTakesEffect) {
  expect_rs_buffers_take_effect(false);
}

TEST(RsMaxInputBuffers, SetOnAUnitAfterTheFirstForwardTakesEffect) {
  expect_rs_buffers_take_effect(true);
}

// bf16 reduce: the RS input is bf16 (half the bytes), one bf16 RS output at a time is cast
// into the fp32 grad shard, and training tracks the fp32 reference.
TEST(Bf16Reduce, HalvesTheRsInputAndTracksTheReference) {
  LoopOptions o;
  o.mp.reduce_dtype = DType::BF16;
  o.steps = 3;
  const int64_t shard = 6 * 12;  // 12 rows over 2 ranks, 12 columns
  const LoopResult got = run_sharded_loop(chain(3, 12), o);
  for (const MemStats& m : got.memory) {
    EXPECT_EQ(m.tag_peak_bytes[static_cast<int>(MemTag::RsInput)], 2 * shard * 2);
    EXPECT_EQ(m.tag_peak_bytes[static_cast<int>(MemTag::RsOutput)], shard * 2);
  }
  expect_matches_reference(got, run_reference_loop(chain(3, 12), o), 1e-2, "bf16 reduce");
  EXPECT_EQ(issued(got, CollectiveKind::ReduceScatter), 3 * o.steps);
}

// A param used twice in one unit: its two grads are summed before the reduce-scatter.
TEST(TiedWeights, TwoUsesOfOneParamSumTheirGrads) {
  const ModelFactory make = [] { return std::make_unique<TiedModel>(10); };
  for (int world : {2, 3}) {
    LoopOptions o;
    o.world = world;
    o.host_sync_every_step = true;
    o.optimizer = "sgd";
    expect_matches_reference(run_sharded_loop(make, o), run_reference_loop(make, o), 1e-6,
                             "world " + std::to_string(world));
  }
}

}  // namespace
}  // namespace fsdp::testing
