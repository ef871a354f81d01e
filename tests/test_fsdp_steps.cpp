// Steps back to back: forward, loss, backward and the optimizer step after step with no host
// synchronization in between, under random stream and collective delays (the CPU backend's
// chaos mode). Each configuration must match the unsharded reference when the host syncs
// every step, and then give exactly the same result under every delay pattern: one step's
// tail (reduce-scatters, casts, accumulation, the optimizer) racing the next step's head
// (all-gathers, explicit unshard/reshard) must not change a single bit.
#include <gtest/gtest.h>

#include "test_fsdp_loop.h"

namespace fsdp::testing {
namespace {

struct StepsCase {
  std::string name;
  ModelFactory make;
  std::function<void(LoopOptions&)> configure;
  double tolerance = 1e-6;  // against the fp32 reference, host synced
  bool unchecked_allocator = false;  // frees return memory at once (a sanitizer sees reuse)
};

void PrintTo(const StepsCase& c, std::ostream* os) { *os << c.name; }  // gtest's GetParam()

ModelFactory chain(int layers, int64_t dim) {
  return [=] { return std::make_unique<ChainModel>(layers, dim); };
}

// Between steps: the first unit's all-gather is started for the next step (as a training
// loop prefetches it), and with `then_reshard` dropped again at once.
std::function<void(LoopOptions&)> async_unshard(bool then_reshard) {
  return [then_reshard](LoopOptions& o) {
    o.before_forward = [then_reshard](LoopModel& m, FsdpModule&, int step, int mb) {
      if (step == 0 || mb != 0) return;
      FsdpModule* first = fsdp_module_of(*m.units()[0]);
      first->unshard(/*async_op=*/true);
      if (then_reshard) first->reshard();
    };
  };
}

std::vector<StepsCase> steps_cases() {
  auto none = [](LoopOptions&) {};
  auto bf16_reduce = [](LoopOptions& o) { o.mp.reduce_dtype = DType::BF16; };
  auto sync_every = [](LoopOptions& o) {
    o.micro_batches = 3;
    o.sync_every_micro_batch = true;
  };
  std::vector<StepsCase> cases = {
      {"fp32", chain(3, 12), none},
      {"bf16Reduce", chain(3, 12), bf16_reduce, 1e-2},
      {"bf16ParamsAndReduce", chain(3, 12),
       [](LoopOptions& o) { o.mp = {DType::BF16, DType::BF16}; }, 3e-2},
      {"syncEveryMicroBatch", chain(3, 12), sync_every},
      {"bf16ReduceSyncEveryMicroBatch", chain(3, 12),
       [=](LoopOptions& o) {
         bf16_reduce(o);
         sync_every(o);
       },
       1e-2},
      {"noSyncAccumulation", chain(3, 12), [](LoopOptions& o) { o.micro_batches = 3; }},
      {"reshardOffTwoRsBuffers", chain(4, 12),
       [](LoopOptions& o) {
         o.reshard_after_forward = false;
         o.rs_max_input_buffers = 2;
       }},
      {"unitUnusedForAWholeStep",
       [] {
         auto m = std::make_unique<BranchModel>(9);
         m->b_every_step = false;
         return m;
       },
       [](LoopOptions& o) { o.steps = 4; }},
      {"unitSkippedOnOneRank",
       [] {
         auto m = std::make_unique<BranchModel>(9);
         m->skip_rank = 1;
         return m;
       },
       none},
      {"tiedWeights", [] { return std::make_unique<TiedModel>(10); }, none},
      {"tiedWeightsBf16Reduce", [] { return std::make_unique<TiedModel>(10); }, bf16_reduce, 1e-2},
      {"asyncUnshardPrefetch", chain(3, 12), async_unshard(false)},
      {"asyncUnshardThenReshard", chain(3, 12), async_unshard(true)},
      {"asyncUnshardThenReshardUnchecked", chain(3, 12), async_unshard(true), 1e-6, true},
  };
  return cases;
}

class BackToBack : public ::testing::TestWithParam<StepsCase> {};

TEST_P(BackToBack, MatchesTheReferenceAndEveryDelayPatternGivesTheSameBits) {
  const StepsCase& c = GetParam();
  LoopOptions o;
  o.world = 2;
  o.steps = 3;
  c.configure(o);
  const LoopResult ref = run_reference_loop(c.make, o);
  o.host_sync_every_step = true;
  const LoopResult synced = run_sharded_loop(c.make, o);
  expect_matches_reference(synced, ref, c.tolerance, c.name + " (host synced)");
  o.host_sync_every_step = false;
  o.cpu.chaos = true;
  o.cpu.chaos_max_us = 100;
  o.cpu.checked = !c.unchecked_allocator;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    o.cpu.chaos_seed = seed;
    const LoopResult got = run_sharded_loop(c.make, o);
    EXPECT_EQ(got.losses, synced.losses) << c.name << " seed " << seed;
    EXPECT_EQ(got.params, synced.params) << c.name << " seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, BackToBack, ::testing::ValuesIn(steps_cases()),
                         [](const ::testing::TestParamInfo<StepsCase>& info) { return info.param.name; });

// Three ranks, more steps and deeper delays for the paths that follow the ring on the RS
// stream (accumulation, the bf16 cast): finalize must join them before the optimizer.
TEST(BackToBackDeep, Bf16ReduceWithAccumulationOnThreeRanks) {
  const ModelFactory make = chain(3, 13);
  LoopOptions o;
  o.world = 3;
  o.steps = 4;
  o.micro_batches = 2;
  o.sync_every_micro_batch = true;
  o.mp.reduce_dtype = DType::BF16;
  o.rs_max_input_buffers = 2;
  o.host_sync_every_step = true;
  const LoopResult synced = run_sharded_loop(make, o);
  expect_matches_reference(synced, run_reference_loop(make, o), 1e-2, "host synced");
  o.host_sync_every_step = false;
  o.cpu.chaos = true;
  o.cpu.chaos_max_us = 300;
  for (uint64_t seed = 11; seed <= 14; ++seed) {
    o.cpu.chaos_seed = seed;
    const LoopResult got = run_sharded_loop(make, o);
    EXPECT_EQ(got.params, synced.params) << "seed " << seed;
  }
}

// The bf16 cast alone (fresh grads every step, no accumulation): it follows the ring's last
// entry on the RS stream, and finalize must join it before the optimizer reads the shard.
TEST(BackToBackDeep, Bf16ReduceCastOnThreeRanks) {
  const ModelFactory make = chain(4, 13);
  LoopOptions o;
  o.world = 3;
  o.steps = 4;
  o.mp.reduce_dtype = DType::BF16;
  o.host_sync_every_step = true;
  const LoopResult synced = run_sharded_loop(make, o);
  expect_matches_reference(synced, run_reference_loop(make, o), 1e-2, "host synced");
  o.host_sync_every_step = false;
  o.cpu.chaos = true;
  o.cpu.chaos_max_us = 300;
  for (uint64_t seed = 21; seed <= 26; ++seed) {
    o.cpu.chaos_seed = seed;
    o.rs_max_input_buffers = 1 + static_cast<int>(seed % 2);
    EXPECT_EQ(run_sharded_loop(make, o).params, synced.params) << "seed " << seed;
  }
}

// Work that follows the ring's last entry on the RS stream (the bf16 cast into the grad
// shard; the accumulation of a second micro-batch's grads), with one small unit, in many
// short runs without chaos: with little queued on compute, an optimizer that does not wait
// for that work often runs ahead of it, and in a run's first step it then reads the fresh
// (poisoned) grad shard.
struct TailCase {
  std::string name;
  int world;
  bool bf16_reduce;  // else fp32 with two synced micro-batches (accumulation)
};

void PrintTo(const TailCase& c, std::ostream* os) { *os << c.name; }

class RsStreamTail : public ::testing::TestWithParam<TailCase> {};

TEST_P(RsStreamTail, FinalizeJoinsItBeforeTheOptimizerInManyShortRuns) {
  const TailCase c = GetParam();
  const ModelFactory make = chain(1, 8);
  LoopOptions o;
  o.world = c.world;
  o.steps = 2;
  if (c.bf16_reduce) {
    o.mp.reduce_dtype = DType::BF16;
  } else {
    o.micro_batches = 2;
    o.sync_every_micro_batch = true;
  }
  o.host_sync_every_step = true;
  const LoopResult synced = run_sharded_loop(make, o);
  expect_matches_reference(synced, run_reference_loop(make, o), c.bf16_reduce ? 1e-2 : 1e-6,
                           "host synced");
  o.host_sync_every_step = false;
  for (int run = 0; run < 40; ++run) {
    const LoopResult got = run_sharded_loop(make, o);
    ASSERT_EQ(got.params, synced.params) << "run " << run;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, RsStreamTail,
                         ::testing::Values(TailCase{"bf16CastTwoRanks", 2, true},
                                           TailCase{"bf16CastThreeRanks", 3, true},
                                           TailCase{"bf16CastFourRanks", 4, true},
                                           TailCase{"accumulationTwoRanks", 2, false},
                                           TailCase{"accumulationThreeRanks", 3, false}),
                         [](const ::testing::TestParamInfo<TailCase>& info) { return info.param.name; });

// unshard(async_op) then reshard() of every unit, several times between steps: the reshard
// must wait for the all-gather it cancels before freeing its buffer. The unchecked allocator
// returns freed memory to the system at once, so an all-gather still writing there corrupts
// the heap (or, under AddressSanitizer, is reported as a use after free).
TEST(ExplicitUnshard, AsyncUnshardThenReshardOfEveryUnitUnderChaos) {
  const ModelFactory make = chain(3, 16);
  LoopOptions o;
  o.steps = 3;
  const LoopResult ref = run_reference_loop(make, o);
  o.before_forward = [](LoopModel& m, FsdpModule&, int step, int) {
    if (step == 0) return;  // FSDP initializes at the first forward
    for (int round = 0; round < 4; ++round)
      for (Module* unit : m.units()) {
        FsdpModule* u = fsdp_module_of(*unit);
        u->unshard(/*async_op=*/true);
        u->reshard();
      }
  };
  o.cpu.chaos = true;
  o.cpu.chaos_max_us = 200;
  o.cpu.checked = false;
  for (uint64_t seed = 31; seed <= 33; ++seed) {
    o.cpu.chaos_seed = seed;
    expect_matches_reference(run_sharded_loop(make, o), ref, 1e-6, "seed " + std::to_string(seed));
  }
}

}  // namespace
}  // namespace fsdp::testing
