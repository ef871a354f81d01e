// Backward misprefetch (FSDP2's test_backward_misprefetch): layers.0 prefetches layers.3 in
// backward, after layers.3's backward already ran. The root's finalize must reshard it, so
// the next step gathers layers.3 again after the optimizer changed its shards.
#include <gtest/gtest.h>

#include <algorithm>

#include "test_fsdp_loop.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig misprefetch_config() {
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 4;
  c.model.dim = 16;
  c.tokens = 4;
  c.steps = 3;
  c.collect_params = true;
  c.customize = [](nn::Model& model, FsdpModule&) {
    fsdp_module_of(*model.blocks()[0])
        ->set_modules_to_backward_prefetch({fsdp_module_of(*model.blocks()[3])});
  };
  return c;
}

TEST(BackwardMisprefetch, LossMatchesTheReferenceAtEveryStep) {
  const runtime::TrainConfig c = misprefetch_config();
  const auto ref = run_reference(c, 2);
  const auto got = run_fsdp(2, c);
  ASSERT_EQ(got[0].losses.size(), ref.losses.size());
  for (int s = 0; s < c.steps; ++s)  // the tolerance of the parity tests
    EXPECT_NEAR(got[0].losses[s], ref.losses[s], 1e-6 * std::abs(ref.losses[s]) + 1e-7) << "step " << s;
  EXPECT_LE(relative_error(got[0].params, ref.params), 1e-6);
}

TEST(BackwardMisprefetch, EventLogShowsTheRegatherInTheNextForward) {
  std::vector<ScheduleEvent> log;
  runtime::TrainConfig c = misprefetch_config();
  c.steps = 2;
  c.event_log = &log;
  run_fsdp(2, c);
  std::vector<std::string> lines;
  for (const auto& e : log) lines.push_back(to_string(e));
  const auto finalize = std::find(lines.begin(), lines.end(), "finalize root finalize");
  ASSERT_NE(finalize, lines.end());
  // Step 1's backward: layers.0 gathers layers.3 again; finalize reshards it.
  const auto misprefetch = std::find(lines.begin(), finalize, "unshard layers.3 pre_backward");
  EXPECT_NE(std::find(misprefetch + 1, finalize, "unshard layers.3 pre_backward"), finalize);
  EXPECT_NE(std::find(lines.begin(), finalize, "reshard layers.3 finalize"), finalize);
  // Step 2's forward gathers layers.3 from its updated shards.
  EXPECT_NE(std::find(finalize, lines.end(), "unshard layers.3 forward"), lines.end());
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "unshard layers.3 forward"), 2);
}

// The same misprefetch in a loop with no host sync between steps, under random delays; the
// unchecked allocator frees at once, so a sanitizer build sees a gather that outlives a
// reshard.
TEST(BackwardMisprefetch, BackToBackStepsUnderChaos) {
  const ModelFactory make = [] { return std::make_unique<ChainModel>(4, 16); };
  LoopOptions o;
  o.customize = [](LoopModel& m, FsdpModule&) {
    fsdp_module_of(*m.units()[0])->set_modules_to_backward_prefetch({fsdp_module_of(*m.units()[3])});
  };
  const LoopResult ref = run_reference_loop(make, o);
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    o.cpu.chaos = true;
    o.cpu.chaos_seed = seed;
    o.cpu.chaos_max_us = 100;
    o.cpu.checked = seed % 2 == 0;
    expect_matches_reference(run_sharded_loop(make, o), ref, 1e-6, "seed " + std::to_string(seed));
  }
}

}  // namespace
}  // namespace fsdp::testing
