// Peak memory against the formula in docs/memory.md.
#include <gtest/gtest.h>

#include "models/model_family.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

int64_t tag_peak(const runtime::RankResult& r, MemTag t) {
  return r.memory.tag_peak_bytes[static_cast<int>(t)];
}

// mlp, 5 blocks of a 64 x 64 weight, 8 tokens, 2 steps.
runtime::TrainConfig mlp_config() {
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 5;
  c.model.dim = 64;
  c.tokens = 8;
  c.steps = 2;
  return c;
}

TEST(PeakMemory, MlpMeetsTheFormulaTermByTerm) {
  for (int world : {1, 2, 4})
    for (int k : {1, 2, 3}) {
      runtime::TrainConfig c = mlp_config();
      c.rs_max_input_buffers = k;
      const int64_t D = 64, L = 5;
      const int64_t shard = (D + world - 1) / world * D;
      const int64_t sharded = 4 * 4 * shard * L;
      const int64_t unit = world * shard * 4;  // fp32 params
      const int64_t rs_in = world * shard * 4;
      for (const auto& r : run_fsdp(world, c)) {
        EXPECT_EQ(tag_peak(r, MemTag::ShardedState), sharded);
        EXPECT_EQ(tag_peak(r, MemTag::AllGather), 2 * unit) << "world " << world;
        EXPECT_EQ(tag_peak(r, MemTag::Unsharded), 0);  // views of the AG output
        // Note [One-rank reduce-scatter]: on one rank each grad is its RS input, held by the
        // ring instead of a copy: the same bytes, under the grad's tag.
        EXPECT_EQ(tag_peak(r, MemTag::RsInput), world == 1 ? 0 : k * rs_in);
        EXPECT_EQ(tag_peak(r, MemTag::RsOutput), 0);  // fp32 RS writes the grad shard itself
        EXPECT_EQ(tag_peak(r, MemTag::Grad), (world == 1 ? k + 1 : 1) * D * D * 4);
        const int64_t bound = sharded + 2 * unit + k * rs_in + D * D * 4 +
                              tag_peak(r, MemTag::Activation) + tag_peak(r, MemTag::Other);
        EXPECT_LE(r.memory.peak_bytes, bound);
        EXPECT_GE(r.memory.peak_bytes, sharded + unit + rs_in);  // the bound is not slack
      }
    }
}

// reshard_after_forward=False: every unit's all-gather output stays alive from its forward to
// its post-backward, so at the end of forward all L units are gathered at once; backward
// gathers nothing.
TEST(PeakMemory, NoReshardAfterForwardHoldsEveryUnitGathered) {
  for (int world : {2, 4}) {
    runtime::TrainConfig c = mlp_config();
    c.reshard_after_forward = false;
    const int64_t D = 64, L = 5;
    const int64_t shard = (D + world - 1) / world * D;
    const int64_t sharded = 4 * 4 * shard * L;
    const int64_t unit = world * shard * 4;
    const int64_t rs_in = world * shard * 4;
    for (const auto& r : run_fsdp(world, c)) {
      EXPECT_EQ(r.all_gathers_backward_first_step, 0);
      EXPECT_EQ(tag_peak(r, MemTag::ShardedState), sharded);
      EXPECT_EQ(tag_peak(r, MemTag::AllGather), L * unit) << "world " << world;
      EXPECT_EQ(tag_peak(r, MemTag::RsInput), rs_in);
      EXPECT_EQ(tag_peak(r, MemTag::Grad), D * D * 4);
      const int64_t bound = sharded + L * unit + rs_in + D * D * 4 +
                            tag_peak(r, MemTag::Activation) + tag_peak(r, MemTag::Other);
      EXPECT_LE(r.memory.peak_bytes, bound);
      EXPECT_GE(r.memory.peak_bytes, sharded + L * unit);
    }
  }
}

// The root stays gathered from its forward to its backward whatever reshard_after_forward the
// blocks have (FSDP2's default for the root), so with false the end of forward holds every
// unit at once, the root included: 5 units for 4 blocks. A unit whose params are views of its
// all-gather output holds that output (AllGather tag); one that copies its params out (several
// params, or padding) holds the copies (Unsharded tag), its output freed at the copy-out.
TEST(PeakMemory, NoReshardAfterForwardHoldsEveryBlockAndTheRoot) {
  const int world = 2;
  // mlp with a head on the root: 4 blocks of views, the root's weight and bias copied out.
  for (bool reshard : {false, true}) {
    runtime::TrainConfig c = mlp_config();
    c.model.layers = 4;
    c.model.classes = 16;
    c.reshard_after_forward = reshard;
    const int64_t block = world * (64 / world) * 64 * 4;
    const int64_t root = (16 * 64 + 16) * 4;
    for (const auto& r : run_fsdp(world, c)) {
      // false: the 4 blocks; true: the block computing and the one prefetched.
      EXPECT_EQ(tag_peak(r, MemTag::AllGather), (reshard ? 2 : 4) * block) << reshard;
      EXPECT_EQ(tag_peak(r, MemTag::Unsharded), root) << reshard;  // kept either way
      EXPECT_EQ(r.all_gathers_backward_first_step, reshard ? 4 : 0);
    }
  }
  // The transformer: every group copies out; the root is the embedding, final norm and head.
  for (bool reshard : {false, true}) {
    runtime::TrainConfig c = tiny_transformer_config(/*steps=*/2);
    c.model.layers = 4;
    c.reshard_after_forward = reshard;
    const std::vector<int64_t> units = models::unit_param_counts(c.model);
    const int64_t block = units[0] * 4, root = units.back() * 4;  // fp32 params
    for (const auto& r : run_fsdp(world, c)) {
      // false: every unit's copies; true: the root's and the computing block's.
      EXPECT_EQ(tag_peak(r, MemTag::Unsharded), (reshard ? 1 : 4) * block + root) << reshard;
      // One all-gather output in flight at a time (every row count is even: no padding);
      // with true, the block prefetched while the one before it computes.
      EXPECT_EQ(tag_peak(r, MemTag::AllGather), block) << reshard;
      EXPECT_EQ(r.all_gathers_backward_first_step, reshard ? 4 : 0);
    }
  }
}

TEST(PeakMemory, OptimizerInBackwardKeepsNoGradShards) {
  runtime::TrainConfig c = mlp_config();
  c.optimizer_in_backward = true;
  const int64_t shard = 32 * 64;  // world 2
  for (const auto& r : run_fsdp(2, c)) {
    EXPECT_EQ(tag_peak(r, MemTag::ShardedState), 3 * 4 * shard * 5);  // params, exp_avg, exp_avg_sq
    EXPECT_EQ(tag_peak(r, MemTag::RsOutput), shard * 4);  // one transient grad shard at a time
  }
}

// Note [Optimizer in backward] with a bf16 average: the optimizer reads the reduce-scatter's
// bf16 output as is, so no fp32 grad shard exists at all; Note [One-rank reduce-scatter]: on
// one rank that output is the RS input itself, which is the grad itself, so there is neither
// an output buffer nor a copy-in buffer.
TEST(PeakMemory, OptimizerInBackwardReadsTheBf16ReduceScatterOutputAsIs) {
  for (int world : {1, 2}) {
    runtime::TrainConfig c = mlp_config();
    c.optimizer_in_backward = true;
    c.param_dtype = DType::BF16;
    c.reduce_dtype = DType::BF16;
    const int64_t shard = 64 / world * 64;
    for (const auto& r : run_fsdp(world, c)) {
      EXPECT_EQ(tag_peak(r, MemTag::RsOutput), world == 1 ? 0 : shard * 2) << "world " << world;
      EXPECT_EQ(tag_peak(r, MemTag::RsInput), world == 1 ? 0 : world * shard * 2)
          << "world " << world;
    }
  }
}

// Note [One-rank reduce-scatter]: bf16 grads under an fp32 reduce, on one rank, go to the
// reduce-scatter uncast (no copy-in buffer at all); on two ranks the copy-in casts to fp32.
TEST(PeakMemory, OneRankBf16GradsUnderAnFp32ReduceNeedNoCopyIn) {
  for (int world : {1, 2})
    for (bool in_backward : {false, true}) {
      runtime::TrainConfig c = mlp_config();
      c.optimizer_in_backward = in_backward;
      if (in_backward) c.optimizer.max_grad_norm = 0;
      c.param_dtype = DType::BF16;
      const int64_t shard = 64 / world * 64;
      for (const auto& r : run_fsdp(world, c))
        EXPECT_EQ(tag_peak(r, MemTag::RsInput), world == 1 ? 0 : world * shard * 4)
            << "world " << world << " optimizer in backward " << in_backward;
    }
}

// Note [One-rank reduce-scatter]: a transformer block's group has many grads, so on one rank
// the copy-in is needed; it writes the fp32 grad shard itself. There is no RS input buffer, no
// RS output, and still one (in-place, launch-free) reduce-scatter per group.
TEST(PeakMemory, OneRankCopyInWritesTheGradShard) {
  int64_t reduce_scatters[3] = {};
  for (int world : {1, 2}) {
    runtime::TrainConfig c = tiny_transformer_config(/*steps=*/2);
    c.param_dtype = DType::BF16;
    for (const auto& r : run_fsdp(world, c)) {
      const int64_t rs_in = tag_peak(r, MemTag::RsInput);
      if (world == 1)
        EXPECT_EQ(rs_in, 0);
      else
        EXPECT_GT(rs_in, 0);
      EXPECT_EQ(tag_peak(r, MemTag::RsOutput), 0) << "world " << world;
      reduce_scatters[world] = r.reduce_scatters_first_step;
    }
  }
  EXPECT_GT(reduce_scatters[1], 0);
  EXPECT_EQ(reduce_scatters[1], reduce_scatters[2]);
}

TEST(PeakMemory, MoeStaysWithinTheBound) {
  for (int k : {1, 2}) {
    runtime::TrainConfig c;
    c.model.kind = "moe";
    c.model.layers = 4;
    c.model.dim = 20;
    c.model.hidden = 24;
    c.model.experts = 3;
    c.model.classes = 6;
    c.tokens = 8;
    c.steps = 2;
    c.rs_max_input_buffers = k;
    const int W = 3, D = 20, H = 24, E = 3, C = 6;
    auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
    const int64_t dense = ceil_div(E, W) * D;                                   // router E x D
    const int64_t experts = E * (ceil_div(H, W) * D + ceil_div(D, W) * H);      // fc1, fc2
    const int64_t head = ceil_div(C, W) * D + ceil_div(C, W);                   // weight, bias
    const int64_t sharded = 4 * 4 * (c.model.layers * (dense + experts) + head);
    const int64_t largest_group = std::max({dense, experts, head});
    const int64_t unit_full = E * D + E * (H * D + D * H);  // a block's params, unsharded
    const int64_t unit_gathered = W * (dense + experts) * 4;
    for (const auto& r : run_fsdp(W, c)) {
      EXPECT_EQ(tag_peak(r, MemTag::ShardedState), sharded);
      EXPECT_LE(tag_peak(r, MemTag::RsInput), k * W * largest_group * 4);
      const int64_t bound = sharded + 2 * (unit_gathered + unit_full * 4) +
                            k * W * largest_group * 4 + largest_group * 4 + unit_full * 4 +
                            tag_peak(r, MemTag::Activation) + tag_peak(r, MemTag::Other);
      EXPECT_LE(r.memory.peak_bytes, bound) << "k " << k;
    }
  }
}

}  // namespace
}  // namespace fsdp::testing
