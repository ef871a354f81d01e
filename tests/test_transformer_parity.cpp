// The transformer under FSDP (fully_shard on each block and on the root) on 1, 2 and 4 CPU
// ranks against the unsharded single-rank reference on the same global batch of synthetic
// tokens, over AdamW steps; and what its first loss and its training must look like.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig transformer_parity_config() {
  runtime::TrainConfig c = tiny_transformer_config(/*steps=*/4);
  c.optimizer.adamw.lr = 3e-3f;
  return c;
}

struct TransformerCase {
  int world;
  RanksAs as = RanksAs::Threads;
};

class TransformerParity : public ::testing::TestWithParam<TransformerCase> {};

TEST_P(TransformerParity, MatchesUnshardedReferenceOverAdamWSteps) {
  const int world = GetParam().world;
  FSDP_SKIP_WITHOUT_PROCESSES(GetParam().as);
  const runtime::TrainConfig c = transformer_parity_config();
  const runtime::RankResult ref = run_reference(c, world);
  const auto results = run_fsdp(world, c, {}, GetParam().as);
  ASSERT_EQ(results[0].params.size(), ref.params.size());
  EXPECT_LE(relative_error(results[0].params, ref.params), 1e-6) << "world " << world;
  for (int s = 0; s < c.steps; ++s)
    EXPECT_NEAR(results[0].losses[s], ref.losses[s], 1e-6 * std::abs(ref.losses[s]));
  for (int r = 1; r < world; ++r) EXPECT_EQ(results[r].params, results[0].params);
  if (world == 1) {
    EXPECT_EQ(results[0].params, ref.params) << "world 1 should be bitwise equal";
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, TransformerParity,
                         ::testing::Values(TransformerCase{1}, TransformerCase{2},
                                           TransformerCase{4},
                                           TransformerCase{2, RanksAs::Processes},
                                           TransformerCase{4, RanksAs::Processes}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.world) +
                                  (info.param.as == RanksAs::Processes ? "_processes" : "");
                         });

// Ranks as processes reduce in fp32 in member order, as ranks as threads do (Note [Gloo
// collectives]): the two give the same bits.
TEST(TransformerParityOptions, RanksAsProcessesGiveTheBitsOfRanksAsThreads) {
  FSDP_SKIP_WITHOUT_PROCESSES(RanksAs::Processes);
  runtime::TrainConfig c = transformer_parity_config();
  for (DType t : {DType::F32, DType::BF16}) {
    c.param_dtype = t;
    const auto threads = run_fsdp(4, c);
    const auto processes = run_fsdp(4, c, {}, RanksAs::Processes);
    ASSERT_EQ(processes.size(), 4u);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(processes[r].params, threads[r].params) << dtype_name(t) << " rank " << r;
      EXPECT_EQ(processes[r].losses, threads[r].losses) << dtype_name(t) << " rank " << r;
    }
  }
}

TEST(TransformerParityOptions, MicroBatchesReshardOffAndOptimizerInBackward) {
  runtime::TrainConfig c = transformer_parity_config();
  c.micro_batches = 2;  // no-sync accumulation on the first micro-batch
  const auto ref = run_reference(c, 2);
  c.reshard_after_forward = false;
  c.prefetch_next_step = true;
  c.rs_max_input_buffers = 2;
  EXPECT_LE(relative_error(run_fsdp(2, c)[0].params, ref.params), 1e-6);
  c.micro_batches = 1;
  const auto ref1 = run_reference(c, 2);
  c.optimizer_in_backward = true;
  EXPECT_LE(relative_error(run_fsdp(2, c)[0].params, ref1.params), 1e-6);
}

// Random delays before every stream op and collective phase: a missing cross-stream wait in
// the transformer's use of saved activations and gathered params would show up as NaN
// (checked mode poisons freed memory) or as a different result.
class TransformerChaos : public ::testing::TestWithParam<RanksAs> {};

TEST_P(TransformerChaos, ChaosSchedulesGiveTheSameParams) {
  FSDP_SKIP_WITHOUT_PROCESSES(GetParam());
  const runtime::TrainConfig c = transformer_parity_config();
  const auto calm = run_fsdp(2, c);
  for (uint64_t seed : {1, 2, 3}) {
    cpu::CpuOptions chaos;
    chaos.chaos = true;
    chaos.chaos_seed = seed;
    chaos.chaos_max_us = 100;
    EXPECT_EQ(run_fsdp(2, c, chaos, GetParam())[0].params, calm[0].params) << "seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAs, TransformerChaos,
                         ::testing::Values(RanksAs::Threads, RanksAs::Processes),
                         [](const auto& info) { return std::string(ranks_as_name(info.param)); });

TEST(TransformerParityOptions, Bf16ComputeTracksTheFp32Reference) {
  runtime::TrainConfig c = transformer_parity_config();
  const auto ref = run_reference(c, 2);
  c.param_dtype = DType::BF16;
  const auto results = run_fsdp(2, c);
  // bf16 params and activations, fp32 shards and optimizer: ~3 significant digits.
  EXPECT_LE(relative_error(results[0].params, ref.params), 1e-2);
  for (int s = 0; s < c.steps; ++s)
    EXPECT_NEAR(results[0].losses[s], ref.losses[s], 1e-2 * ref.losses[s]);
}

TEST(TransformerTraining, StartsAtLnVocabAndLearnsTheSyntheticRule) {
  runtime::TrainConfig c = transformer_parity_config();
  c.steps = 40;
  c.collect_params = false;
  c.optimizer.adamw.lr = 1e-2f;
  const auto results = run_fsdp(2, c);
  const std::vector<float>& loss = results[0].losses;
  // std 0.02 weights make the logits nearly equal, so the first loss is near ln(vocab): the
  // logits' std is 0.02 * sqrt(dim) = 0.11 (the final norm makes h's RMS 1), so the mean over
  // 32 tokens of the label's logit moves by about 0.02, and softmax's lse by less.
  EXPECT_NEAR(loss.front(), std::log(61.0), 0.1);
  // 3 of 4 next tokens follow a fixed rule of the previous one: a bigram the model learns.
  // (Its best loss is about 0.25 ln 61 + H(3/4) = 1.6.)
  EXPECT_LT(loss.back(), 3.0f) << "first " << loss.front();
}

TEST(TransformerCli, TrainsOnTwoRanksAndTheLossFalls) {
  const std::string json = ::testing::TempDir() + "transformer_summary.json";
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 2 --model transformer --layers 2 --dim 32 --heads 4 "
      "--kv-heads 2 --ffn-dim 40 --seq-len 8 --vocab 61 --tokens 16 --steps 40 --lr 1e-2 "
      "--quiet --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(json);
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["model"], "transformer");
  EXPECT_NEAR(s["loss_first"].get<double>(), std::log(61.0), 0.1);
  EXPECT_LT(s["loss_last"].get<double>(), 3.0);
}

}  // namespace
}  // namespace fsdp::testing
