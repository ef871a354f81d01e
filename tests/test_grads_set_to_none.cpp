// Note [Grads set to none]: FSDP2's zero_grad(set_to_none=True). The grad shards are freed
// after each optimizer step and made again by the next backward, which changes no value and
// takes the grads out of every moment before backward, the loss included.
#include <gtest/gtest.h>

#include "runtime/memory_estimate.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

// A transformer whose peak, with the grads kept, is at the loss (its activations and logits
// and every grad shard): freeing the grads lowers it.
runtime::TrainConfig activation_heavy(bool set_to_none) {
  runtime::TrainConfig c = tiny_transformer_config(3);
  c.model.dim = 64;
  c.model.ffn_dim = 256;
  c.model.vocab = 256;
  c.model.seq_len = 32;
  c.tokens = 128;
  c.optimizer.max_grad_norm = 1.0f;  // the clipping sums read the rebound grads
  c.zero_grad_set_to_none = set_to_none;
  return c;
}

void expect_same_run(const runtime::RankResult& a, const runtime::RankResult& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i;
    EXPECT_EQ(a.grad_norms[i], b.grad_norms[i]) << "step " << i;
  }
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) EXPECT_EQ(a.params[i], b.params[i]) << "param " << i;
}

// Under chaos delays: a free or a rebind out of stream order would read poisoned memory.
TEST(GradsSetToNone, TrainsBitwiseAsWithKeptGrads) {
  for (int micro_batches : {1, 2}) {
    runtime::TrainConfig kept = activation_heavy(false), freed = activation_heavy(true);
    kept.micro_batches = freed.micro_batches = micro_batches;
    const auto a = run_fsdp(2, kept), b = run_fsdp(2, freed, chaos_options(81));
    SCOPED_TRACE("micro_batches " + std::to_string(micro_batches));
    expect_same_run(a[0], b[0]);
  }
}

TEST(GradsSetToNone, TrainsTheMoeTransformerBitwiseOnItsExpertMesh) {
  runtime::TrainConfig kept = tiny_moe_transformer_config(/*ep=*/2, /*experts=*/4, 3);
  kept.optimizer.max_grad_norm = 1.0f;
  runtime::TrainConfig freed = kept;
  freed.zero_grad_set_to_none = true;
  const auto a = run_fsdp(2, kept), b = run_fsdp(2, freed);
  expect_same_run(a[0], b[0]);
}

// After each step's work is issued the sharded state is the params and AdamW's two moments:
// 3 fp32 copies of the shard, where kept grads make it 4.
TEST(GradsSetToNone, NoGradShardLivesBetweenSteps) {
  for (bool set_to_none : {false, true}) {
    runtime::TrainConfig c = activation_heavy(set_to_none);
    int64_t shard_numel = 0;
    std::vector<int64_t> between_steps;
    c.on_start = [&](runtime::TrainState& s) {
      for (const ShardedGroupView& g : sharded_groups(s.root, false)) shard_numel += g.numel;
    };
    c.after_step = [&](runtime::TrainState& s) {
      between_steps.push_back(
          s.device.memory_stats().tag_bytes[static_cast<int>(MemTag::ShardedState)]);
    };
    runtime::run_cpu_ranks(1, {}, [&](int, Device& device, std::shared_ptr<Comm> comm) {
      runtime::train_rank(device, comm, c);
    });
    ASSERT_EQ(between_steps.size(), 3u);
    for (int64_t bytes : between_steps)
      EXPECT_EQ(bytes, shard_numel * 4 * (set_to_none ? 3 : 4)) << "set_to_none " << set_to_none;
  }
}

// The grads leave the loss's moment: the peak falls, and the estimate follows it. With
// micro-batches too: the ones without the sync reduce nothing and make no grad shard (they
// once made every shard, zeroed, at their finalize, so the peak did not move).
TEST(GradsSetToNone, LowersThePeakAndTheEstimateFollowsIt) {
  const int world = 2;
  for (int micro_batches : {1, 2}) {
    SCOPED_TRACE("micro_batches " + std::to_string(micro_batches));
    runtime::TrainConfig kept = activation_heavy(false), freed = activation_heavy(true);
    kept.micro_batches = freed.micro_batches = micro_batches;
    const auto kept_run = run_fsdp(world, kept);
    const double peak_kept = static_cast<double>(kept_run[0].memory.peak_bytes);
    const double peak_freed = static_cast<double>(run_fsdp(world, freed)[0].memory.peak_bytes);
    // The sharded state after the optimizer is made: params, grads and two moments, in fp32.
    const double grad_bytes = static_cast<double>(kept_run[0].sharded_state_bytes) / 4;
    EXPECT_LT(peak_freed, peak_kept - 0.5 * grad_bytes)
        << "kept " << peak_kept << ", freed " << peak_freed << ", grads " << grad_bytes;
    const double estimate =
        static_cast<double>(runtime::estimate_rank_memory(freed, world).device_bytes);
    EXPECT_NEAR(estimate / peak_freed, 1.0, 0.05)
        << "estimate " << estimate << ", measured " << peak_freed;
  }
}

TEST(GradsSetToNone, RefusesWhatMustKeepItsGradsInOneLine) {
  const auto refused = [](const std::function<void(runtime::TrainConfig&)>& set) {
    runtime::TrainConfig c = activation_heavy(true);
    set(c);
    return option_error_of([&] { runtime::check_train_config(c, 2); });
  };
  const auto graph = refused([](runtime::TrainConfig& c) { c.cuda_graph = true; });
  EXPECT_EQ(graph.first, "zero_grad_set_to_none");
  EXPECT_NE(graph.second.find("captured step"), std::string::npos) << graph.second;
  const auto in_forward = refused([](runtime::TrainConfig& c) { c.optimizer_in_forward = true; });
  EXPECT_NE(in_forward.second.find("the next forward reads the grads"), std::string::npos)
      << in_forward.second;
  const auto offload = refused([](runtime::TrainConfig& c) { c.offload_optimizer = true; });
  EXPECT_NE(offload.second.find("offload"), std::string::npos) << offload.second;
  const auto in_backward = refused([](runtime::TrainConfig& c) {
    c.optimizer.max_grad_norm = 0;
    c.optimizer_in_backward = true;
  });
  EXPECT_NE(in_backward.second.find("keeps no grads"), std::string::npos) << in_backward.second;
  for (const auto& e : {graph, in_forward, offload, in_backward})
    EXPECT_EQ(e.second.find('\n'), std::string::npos) << e.second;
}

}  // namespace
}  // namespace fsdp::testing
