// HSDP (docs/hsdp.md): a replicate x shard mesh against plain FSDP and the unsharded
// reference, on 4 and 8 CPU ranks as 2x2, 2x4 and 4x2; accumulation without the all-reduce;
// gradient clipping; the RS ring's bound; chaos; checkpoints.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>

#include "io/file_io.h"

#include "test_fsdp_loop.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig mlp_config() {
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 3;
  c.model.dim = 17;  // odd: padding on every shard size
  c.tokens = 6;
  c.steps = 4;
  c.collect_params = true;
  return c;
}

runtime::TrainConfig transformer_config() {
  runtime::TrainConfig c = tiny_transformer_config(/*steps=*/3);
  c.optimizer.adamw.lr = 3e-3f;
  return c;
}

struct HsdpCase {
  std::string kind;
  int replicas, shard;
};
void PrintTo(const HsdpCase& c, std::ostream* os) {
  *os << c.kind << " " << c.replicas << "x" << c.shard;
}

class HsdpParity : public ::testing::TestWithParam<HsdpCase> {};

// The grads are averaged over all replicate x shard ranks: the result is the reference's,
// and plain FSDP's on the same ranks. The grad norm (clipping on) counts each shard once.
TEST_P(HsdpParity, MatchesReferenceAndPlainFsdp) {
  const HsdpCase p = GetParam();
  const int world = p.replicas * p.shard;
  runtime::TrainConfig c = p.kind == "mlp" ? mlp_config() : transformer_config();
  c.optimizer.max_grad_norm = 0.05f;  // small enough to clip: a wrong norm changes the params
  const runtime::RankResult ref = run_reference(c, world);
  const auto plain = run_fsdp(world, c);
  c.hsdp_replicas = p.replicas;
  const auto hsdp = run_fsdp(world, c);
  ASSERT_EQ(hsdp[0].params.size(), ref.params.size());
  EXPECT_LE(relative_error(hsdp[0].params, ref.params), 1e-6);
  EXPECT_LE(relative_error(hsdp[0].params, plain[0].params), 1e-6);
  for (int s = 0; s < c.steps; ++s) {
    EXPECT_NEAR(hsdp[0].losses[s], ref.losses[s], 1e-6 * std::abs(ref.losses[s]) + 1e-7);
    EXPECT_NEAR(hsdp[0].grad_norms[s], ref.grad_norms[s], 1e-5 * ref.grad_norms[s]) << "step " << s;
  }
  for (int r = 1; r < world; ++r) EXPECT_EQ(hsdp[r].params, hsdp[0].params) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Meshes, HsdpParity,
                         ::testing::Values(HsdpCase{"mlp", 2, 2}, HsdpCase{"mlp", 2, 4},
                                           HsdpCase{"mlp", 4, 2}, HsdpCase{"transformer", 2, 2},
                                           HsdpCase{"transformer", 2, 4},
                                           HsdpCase{"transformer", 4, 2}),
                         [](const auto& info) {
                           return info.param.kind + "_" + std::to_string(info.param.replicas) +
                                  "x" + std::to_string(info.param.shard);
                         });

TEST(HsdpOptions, MicroBatchesBf16ReduceSeparateGroupOptimizerInBackwardAndMoe) {
  runtime::TrainConfig c = mlp_config();
  c.micro_batches = 2;  // no gradient sync on the first: no RS, no AR
  const auto ref = run_reference(c, 4);
  c.hsdp_replicas = 2;
  c.separate_rs_group = true;
  c.rs_max_input_buffers = 2;
  c.reshard_after_forward = false;
  EXPECT_LE(relative_error(run_fsdp(4, c)[0].params, ref.params), 1e-6);

  runtime::TrainConfig o = mlp_config();
  const auto ref1 = run_reference(o, 4);
  o.hsdp_replicas = 2;
  o.optimizer_in_backward = true;  // the step runs on the all-reduce stream
  o.prefetch_next_step = true;
  EXPECT_LE(relative_error(run_fsdp(4, o)[0].params, ref1.params), 1e-6);
  o.optimizer_in_backward = false;
  o.reduce_dtype = DType::BF16;  // RS and AR in bf16: ~3 significant digits
  EXPECT_LE(relative_error(run_fsdp(4, o)[0].params, ref1.params), 2e-2);

  runtime::TrainConfig m = mlp_config();
  m.model.kind = "moe";
  m.model.hidden = 10;
  m.model.experts = 3;
  m.model.classes = 5;
  const auto ref2 = run_reference(m, 4);
  m.hsdp_replicas = 2;  // the experts' mesh is 2 x 2 too
  EXPECT_LE(relative_error(run_fsdp(4, m)[0].params, ref2.params), 1e-6);
}

// Note [Gradient divide factor] on a 2-D mesh: with F = (R x S) / 2 every grad doubles, which
// for SGD without weight decay is the reference with twice the lr.
TEST(HsdpOptions, GradientDivideFactorCountsEveryReplica) {
  runtime::TrainConfig c = mlp_config();
  c.optimizer.kind = "sgd";
  c.optimizer.sgd_lr = 2e-2f;
  const auto ref = run_reference(c, 4);
  c.optimizer.sgd_lr = 1e-2f;
  c.hsdp_replicas = 2;
  c.customize = [](nn::Model&, FsdpModule& root) { root.set_gradient_divide_factor(2.0); };
  EXPECT_LE(relative_error(run_fsdp(4, c)[0].params, ref.params), 1e-6);
}

// docs/memory.md: on an R x S mesh every rank holds what plain FSDP on S ranks holds; with
// set_requires_all_reduce(false) one partial RS output per group waits for the all-reduce.
TEST(HsdpMemory, ShardsOverTheShardGroupAndKeepsOnePartialPerGroup) {
  runtime::TrainConfig c = mlp_config();
  c.steps = 1;
  const int64_t on_two = run_fsdp(2, c)[0].sharded_state_bytes;
  c.hsdp_replicas = 2;
  EXPECT_EQ(run_fsdp(4, c)[0].sharded_state_bytes, on_two);
  LoopOptions o;
  o.world = 4;
  o.hsdp_replicas = 2;
  o.steps = 1;
  o.micro_batches = 2;
  o.sync_every_micro_batch = true;
  o.before_forward = [&](LoopModel&, FsdpModule& root, int, int mb) {
    root.set_requires_all_reduce(mb == 1);
  };
  const ModelFactory make = [] { return std::make_unique<ChainModel>(3, 12); };
  const auto r = run_sharded_loop(make, o);
  expect_matches_reference(r, run_reference_loop(make, o), 1e-6, "partial sums");
  // 3 partial outputs after micro-batch 0, + the one RS output in flight during micro-batch 1.
  EXPECT_EQ(r.memory[0].tag_peak_live[static_cast<int>(MemTag::RsOutput)], 3 + 1);
}

// set_requires_all_reduce(false) on every micro-batch but the last: the reduce-scattered
// grads add up in the partial buffer and one all-reduce per group syncs the replicas.
TEST(HsdpAccumulation, RequiresAllReduceFalseSumsUntilTheLastMicroBatch) {
  LoopOptions o;
  o.world = 4;
  o.hsdp_replicas = 2;
  o.steps = 2;
  o.micro_batches = 3;
  o.sync_every_micro_batch = true;
  o.before_forward = [&](LoopModel&, FsdpModule& root, int, int mb) {
    root.set_requires_all_reduce(mb == o.micro_batches - 1);
  };
  const ModelFactory make = [] { return std::make_unique<ChainModel>(3, 12); };
  const LoopResult ref = run_reference_loop(make, o);
  const LoopResult got = run_sharded_loop(make, o);
  expect_matches_reference(got, ref, 1e-6, "requires_all_reduce off but last");
  const auto rs = static_cast<int>(CollectiveKind::ReduceScatter);
  const auto ar = static_cast<int>(CollectiveKind::AllReduce);
  for (int r = 0; r < o.world; ++r) {
    EXPECT_EQ(got.issued[r][rs], 3 * 3 * 2) << "an RS per unit and micro-batch";
    EXPECT_EQ(got.issued[r][ar], 3 * 2 + 1) << "an AR per unit and step, + the loss's";
  }
  // Without the flag: one all-reduce per unit and micro-batch, the same result.
  o.before_forward = nullptr;
  const LoopResult every = run_sharded_loop(make, o);
  expect_matches_reference(every, ref, 1e-6, "all-reduce every micro-batch");
  EXPECT_EQ(every.issued[0][ar], 3 * 3 * 2 + 1);
}

TEST(HsdpAccumulation, GradientSyncOffStillMeansNoAllReduce) {
  LoopOptions o;
  o.world = 4;
  o.hsdp_replicas = 2;
  o.steps = 2;
  o.micro_batches = 2;  // sync on the last micro-batch only
  const ModelFactory make = [] { return std::make_unique<ChainModel>(2, 8); };
  const LoopResult got = run_sharded_loop(make, o);
  expect_matches_reference(got, run_reference_loop(make, o), 1e-6, "no sync");
  EXPECT_EQ(got.issued[0][static_cast<int>(CollectiveKind::ReduceScatter)], 2 * 2);
  EXPECT_EQ(got.issued[0][static_cast<int>(CollectiveKind::AllReduce)], 2 * 2 + 1);
}

// The ring bounds the RS inputs alone (the RS output waits for its all-reduce elsewhere):
// at most k alive, and k is reached.
TEST(HsdpRing, BoundHoldsAndIsReached) {
  for (int k : {1, 2, 3}) {
    runtime::TrainConfig c = mlp_config();
    c.model.layers = 5;
    c.steps = 2;
    c.rs_max_input_buffers = k;
    c.hsdp_replicas = 2;
    for (const auto& rank : run_fsdp(4, c))
      EXPECT_EQ(tag_peak_live(rank, MemTag::RsInput), k) << "k " << k;
  }
}

TEST(HsdpChaos, SeedsKeepParityAndReadNoPoison) {
  runtime::TrainConfig c = mlp_config();
  c.model.kind = "moe";
  c.model.layers = 2;
  c.model.dim = 12;
  c.model.hidden = 10;
  c.model.experts = 3;
  c.model.classes = 4;
  c.steps = 2;
  const auto ref = run_reference(c, 4);
  c.optimizer.max_grad_norm = 0.05f;
  const auto ref_clipped = run_reference(c, 4);
  c.hsdp_replicas = 2;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    c.rs_max_input_buffers = 1 + static_cast<int>(seed % 2);
    c.separate_rs_group = (seed / 2) % 2 == 1;
    c.optimizer_in_backward = seed % 3 == 0;
    c.prefetch_next_step = seed % 5 < 3;
    c.optimizer.max_grad_norm = c.optimizer_in_backward ? 0.0f : 0.05f;  // reads every grad
    cpu::CpuOptions o;
    o.chaos = true;
    o.chaos_seed = seed;
    o.chaos_max_us = 100;
    const auto r = run_fsdp(4, c, o);
    const auto& want = c.optimizer_in_backward ? ref.params : ref_clipped.params;
    ASSERT_LE(relative_error(r[0].params, want), 1e-6) << "seed " << seed;
  }
}

TEST(HsdpChaos, PostForwardReshardUnderDelays) {
  runtime::TrainConfig c = mlp_config();
  c.model.layers = 3;
  c.steps = 2;
  const auto ref = run_reference(c, 8);
  c.hsdp_replicas = 2;
  c.reshard_after_forward_size = 2;  // shard 4 -> groups of 2 after forward
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    c.prefetch_next_step = seed % 2 == 0;
    cpu::CpuOptions o;
    o.chaos = true;
    o.chaos_seed = seed;
    o.chaos_max_us = 100;
    ASSERT_LE(relative_error(run_fsdp(8, c, o)[0].params, ref.params), 1e-6) << "seed " << seed;
  }
}

// Saving from one replica is the whole state; a resume feeds every replica, on any mesh.
TEST(HsdpCheckpoint, OneReplicaSavesAndEveryReplicaResumes) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "hsdp_ckpt";
  fs::remove_all(dir);
  runtime::TrainConfig c = mlp_config();
  c.steps = 4;
  const auto straight = run_fsdp(4, c);
  runtime::TrainConfig first = c;
  first.steps = 2;
  first.hsdp_replicas = 2;
  first.checkpoint.save_dir = dir;
  std::mutex mu;
  std::vector<std::string> written;  // rank files, from every rank thread
  io::set_fault_hook_for_testing([&](const std::string& stage, const std::string& path) {
    std::lock_guard<std::mutex> lock(mu);
    if (stage == "rank-file-written") written.push_back(path);
  });
  run_fsdp(4, first);
  io::set_fault_hook_for_testing(nullptr);
  EXPECT_EQ(written.size(), 2u) << "replica 0's two shard ranks write, replica 1 does not";
  const std::string step_dir = dir + "/step-000002";
  ASSERT_TRUE(fs::exists(step_dir + "/COMPLETE"));
  EXPECT_TRUE(fs::exists(step_dir + "/rank-00001.safetensors"));
  EXPECT_FALSE(fs::exists(step_dir + "/rank-00002.safetensors")) << "one replica's shards only";
  for (int replicas : {2, 4}) {  // 2x2 as saved, and 4x1 (every rank whole)
    runtime::TrainConfig resumed = c;
    resumed.hsdp_replicas = replicas;
    resumed.checkpoint.resume = dir;
    const auto r = run_fsdp(4, resumed);
    EXPECT_LE(relative_error(r[0].params, straight[0].params), 1e-6) << replicas;
    for (int rank = 1; rank < 4; ++rank) EXPECT_EQ(r[rank].params, r[0].params);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fsdp::testing
