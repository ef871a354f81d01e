// The schedule's invariants (docs/design.md): collective counts, event order, the RS ring's
// bound under every firing order, overlap, chaos.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/fsdp_state.h"
#include "fsdp/error.h"
#include "test_util.h"
#include "models/model_family.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig small(const std::string& kind, int layers) {
  runtime::TrainConfig c;
  c.model.kind = kind;
  c.model.layers = layers;
  c.model.dim = 12;
  c.model.hidden = 10;
  c.model.experts = 3;
  c.model.classes = kind == "moe" ? 4 : 0;
  c.tokens = 5;
  c.steps = 2;
  return c;
}

// ---- exact collective counts per step
TEST(CollectiveCounts, MlpWithReshard) {
  auto r = run_fsdp(2, small("mlp", 4));
  EXPECT_EQ(r[0].all_gathers_forward_first_step, 4);   // one per block; the root has no params
  EXPECT_EQ(r[0].all_gathers_backward_first_step, 4);  // every block was resharded
  EXPECT_EQ(r[0].reduce_scatters_first_step, 4);
}

TEST(CollectiveCounts, MoeTwoGroupsPerBlockPlusRootHead) {
  for (bool reshard : {true, false}) {
    auto c = small("moe", 3);
    c.reshard_after_forward = reshard;
    auto r = run_fsdp(2, c);
    EXPECT_EQ(r[0].all_gathers_forward_first_step, 2 * 3 + 1);  // dense + experts, + head
    EXPECT_EQ(r[0].all_gathers_backward_first_step, reshard ? 2 * 3 : 0);  // root kept
    EXPECT_EQ(r[0].reduce_scatters_first_step, 2 * 3 + 1);
  }
}

TEST(CollectiveCounts, NoSyncMicroBatchIssuesNoReduceScatter) {
  auto c = small("mlp", 3);
  c.micro_batches = 2;
  auto r = run_fsdp(2, c);
  // Counts are for micro-batch 0 of step 0, which runs with gradient sync off.
  EXPECT_EQ(r[0].reduce_scatters_first_step, 0);
}

// ---- event order
std::vector<std::string> logged(runtime::TrainConfig c) {
  std::vector<ScheduleEvent> log;
  c.steps = 1;
  c.event_log = &log;
  run_fsdp(2, c);
  std::vector<std::string> out;
  for (const auto& e : log) out.push_back(to_string(e));
  return out;
}

TEST(EventOrder, DefaultPrefetchGathersThePreviousBlockBeforeThisBackward) {
  const std::vector<std::string> expected = {
      "unshard layers.0 forward",      "reshard layers.0 forward",
      "unshard layers.1 forward",      "reshard layers.1 forward",
      "unshard layers.2 forward",      "reshard layers.2 forward",
      "unshard layers.2 pre_backward", "unshard layers.1 pre_backward",
      "post_backward layers.2 post_backward", "reduce_scatter layers.2 post_backward",
      "unshard layers.0 pre_backward",
      "post_backward layers.1 post_backward", "reduce_scatter layers.1 post_backward",
      "post_backward layers.0 post_backward", "reduce_scatter layers.0 post_backward",
      "finalize root finalize"};
  EXPECT_EQ(logged(small("mlp", 3)), expected);
}

TEST(EventOrder, ExplicitPrefetchChangesTheOrderAsAsked) {
  auto c = small("mlp", 3);
  c.customize = [](nn::Model& model, FsdpModule&) {
    auto* l0 = fsdp_module_of(*model.blocks()[0]);
    auto* l1 = fsdp_module_of(*model.blocks()[1]);
    auto* l2 = fsdp_module_of(*model.blocks()[2]);
    l0->set_modules_to_forward_prefetch({l1, l2});
    l2->set_modules_to_backward_prefetch({l0});
  };
  const std::vector<std::string> expected = {
      "unshard layers.0 forward",      "unshard layers.1 forward",
      "unshard layers.2 forward",      "reshard layers.0 forward",
      "reshard layers.1 forward",      "reshard layers.2 forward",
      "unshard layers.2 pre_backward", "unshard layers.0 pre_backward",
      "post_backward layers.2 post_backward", "reduce_scatter layers.2 post_backward",
      "unshard layers.1 pre_backward",
      "post_backward layers.1 post_backward", "reduce_scatter layers.1 post_backward",
      "post_backward layers.0 post_backward", "reduce_scatter layers.0 post_backward",
      "finalize root finalize"};
  EXPECT_EQ(logged(c), expected);
}

// ---- the RS ring's bound, for every firing order of the MoE block's groups
using nn::MoeGradOrder;
const MoeGradOrder kOrders[] = {MoeGradOrder::DenseFirst, MoeGradOrder::ExpertsFirst,
                                MoeGradOrder::Interleaved, MoeGradOrder::ExpertsDeferred};

TEST(RsRing, BoundHoldsForEveryFiringOrderAndIsReached) {
  for (MoeGradOrder order : kOrders)
    for (int k : {1, 2, 4}) {
      auto c = small("moe", 4);  // 9 reduce-scatters per step: deeper than any k here
      c.model.grad_order = order;
      c.rs_max_input_buffers = k;
      auto r = run_fsdp(2, c);
      for (const auto& rank : r)
        EXPECT_EQ(tag_peak_live(rank, MemTag::RsInput), k)
            << "order " << static_cast<int>(order) << " k " << k;
    }
}

TEST(RsRing, ResultsDoNotDependOnFiringOrder) {
  std::vector<std::vector<float>> first;
  for (MoeGradOrder order : kOrders) {
    auto c = small("moe", 2);
    c.model.grad_order = order;
    c.collect_params = true;
    auto r = run_fsdp(2, c);
    if (first.empty()) first = r[0].params;
    else EXPECT_LE(relative_error(r[0].params, first), 1e-6) << static_cast<int>(order);
  }
}

TEST(RsRing, Fsdp212DrainGrowsWithLayersWhileTheRingStaysAtK) {
  // 2.12 drains only in the group with the last index (experts). When the experts' grads
  // come last (deferred weight grads), nothing drains during backward.
  std::vector<int64_t> legacy;
  for (int layers : {2, 4, 6}) {
    auto c = small("moe", layers);
    c.model.grad_order = MoeGradOrder::ExpertsDeferred;
    c.rs_policy = RsReclaimPolicy::Fsdp2_12LastGroupDrains;
    legacy.push_back(tag_peak_live(run_fsdp(2, c)[0], MemTag::RsInput));
    c.rs_policy = RsReclaimPolicy::BoundedRing;
    EXPECT_EQ(tag_peak_live(run_fsdp(2, c)[0], MemTag::RsInput), 1);
  }
  EXPECT_EQ(legacy, (std::vector<int64_t>{3, 5, 7}));  // the dense groups + the head
}

// ---- chaos: random delays in every stream op and collective phase
TEST(Chaos, FiftySeedsKeepParityAndReadNoPoison) {
  auto c = small("moe", 2);
  c.collect_params = true;
  const auto ref = run_reference(c, 2);
  int runs = 0;
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    c.rs_max_input_buffers = 1 + static_cast<int>(seed % 2);
    c.separate_rs_group = (seed / 2) % 2 == 1;
    c.optimizer_in_backward = seed % 3 == 0;  // the newer paths under random delays too
    c.optimizer_in_forward = seed % 3 == 1;
    c.prefetch_next_step = seed % 5 < 3;
    cpu::CpuOptions o;
    o.chaos = true;
    o.chaos_seed = seed;
    o.chaos_max_us = 100;
    auto r = run_fsdp(2, c, o);
    const double err = relative_error(r[0].params, ref.params);
    ASSERT_LE(err, 1e-6) << "seed " << seed;  // NaN from poisoned memory fails this too
    ++runs;
  }
  EXPECT_EQ(runs, 50);
}

// The same with ranks as processes over Gloo, on fewer seeds (each run forks its ranks).
TEST(Chaos, SeedsKeepParityWithRanksAsProcesses) {
  FSDP_SKIP_WITHOUT_PROCESSES(RanksAs::Processes);
  auto c = small("moe", 2);
  c.collect_params = true;
  const auto ref = run_reference(c, 2);
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    c.rs_max_input_buffers = 1 + static_cast<int>(seed % 2);
    c.separate_rs_group = (seed / 2) % 2 == 1;
    c.optimizer_in_backward = seed % 3 == 0;
    c.prefetch_next_step = seed % 5 < 3;
    cpu::CpuOptions o;
    o.chaos = true;
    o.chaos_seed = seed;
    o.chaos_max_us = 100;
    const auto r = run_fsdp(2, c, o, RanksAs::Processes);
    ASSERT_LE(relative_error(r[0].params, ref.params), 1e-6) << "seed " << seed;
  }
}

// ---- bad input
TEST(BadInput, ClearErrors) {
  runtime::TrainConfig c = small("mlp", 2);
  c.rs_max_input_buffers = 0;
  try {
    run_fsdp(2, c);
    FAIL() << "k = 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be a positive integer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(runtime::run_cpu_ranks(0, {}, [](int, Device&, std::shared_ptr<Comm>) {}), Error);
}

// Note [Sub-meshes]: a param group's mesh may be a subset of the module's mesh (the experts'
// efsdp mesh inside dp), but not reach past it.
TEST(BadInput, PlacementMeshOutsideTheModulesMesh) {
  try {
    runtime::run_cpu_ranks(2, {}, [](int rank, Device& device, std::shared_ptr<Comm> world) {
      Mesh world_mesh("world", device, world);
      // each rank alone: the module's mesh spans one rank, the placement mesh two
      Mesh lonely("lonely", device, world->split(rank, 0, "lonely"));
      std::unique_ptr<nn::Model> model_built = models::build_model(tiny_mlp_config(1, 4));
  nn::Model& model = *model_built;
      FullyShardOptions o;
      o.shard_placement_fn = [&](const Module&, const Param&) { return &world_mesh; };
      fully_shard(model, lonely, o);
    });
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a subset of mesh 'lonely'"), std::string::npos)
        << e.what();
  }
}

TEST(SubMesh, APlacementMeshInsideTheModulesMeshIsAccepted) {
  runtime::run_cpu_ranks(2, {}, [](int rank, Device& device, std::shared_ptr<Comm> world) {
    Mesh dp("dp", device, world);
    Mesh lonely("lonely", device, world->split(rank, 0, "lonely"));
    std::unique_ptr<nn::Model> model_built = models::build_model(tiny_mlp_config(1, 4));
  nn::Model& model = *model_built;
    FullyShardOptions o;
    o.shard_placement_fn = [&](const Module&, const Param&) { return &lonely; };
    FsdpModule& root = fully_shard(model, dp, o);
    // one rank per mesh: the whole param on each
    EXPECT_EQ(sharded_groups(root, false).at(0).numel, 16);
  });
}

}  // namespace
}  // namespace fsdp::testing
