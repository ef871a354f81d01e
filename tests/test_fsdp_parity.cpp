// FSDP on 1..8 CPU ranks against an unsharded single-rank reference on the same global batch.
#include <gtest/gtest.h>

#include "test_util.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig parity_config(const std::string& kind) {
  runtime::TrainConfig c;
  c.model.kind = kind;
  c.model.layers = 3;
  c.model.dim = 17;       // odd: 17 rows never divide evenly, so padding is exercised
  c.model.hidden = 257;   // expert weights are 257x17 and 17x257
  c.model.experts = 3;
  c.model.classes = kind == "mlp" ? 0 : 5;
  c.tokens = 6;
  c.steps = 4;
  c.collect_params = true;
  return c;
}

struct ParityCase {
  std::string kind;
  int world;
  RanksAs as = RanksAs::Threads;
};

void PrintTo(const ParityCase& c, std::ostream* os) {
  *os << c.kind << " on " << c.world << " ranks as " << ranks_as_name(c.as);
}

class Parity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(Parity, MatchesUnshardedReferenceOverAdamWSteps) {
  const ParityCase p = GetParam();
  FSDP_SKIP_WITHOUT_PROCESSES(p.as);
  runtime::TrainConfig c = parity_config(p.kind);
  const runtime::RankResult ref = run_reference(c, p.world);
  const auto results = run_fsdp(p.world, c, {}, p.as);
  ASSERT_EQ(results[0].params.size(), ref.params.size());
  const double err = relative_error(results[0].params, ref.params);
  EXPECT_LE(err, 1e-6) << p.kind << " world " << p.world;
  for (int s = 0; s < c.steps; ++s)
    EXPECT_NEAR(results[0].losses[s], ref.losses[s], 1e-6 * std::abs(ref.losses[s]) + 1e-7);
  // Every rank gathers the same full params.
  for (int r = 1; r < p.world; ++r) EXPECT_EQ(results[r].params, results[0].params);
  if (p.world == 1) {
    EXPECT_EQ(results[0].params, ref.params) << "world 1 should be bitwise equal";
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, Parity,
                         ::testing::Values(ParityCase{"mlp", 1}, ParityCase{"mlp", 2},
                                           ParityCase{"mlp", 3}, ParityCase{"mlp", 4},
                                           ParityCase{"mlp", 8}, ParityCase{"moe", 1},
                                           ParityCase{"moe", 2}, ParityCase{"moe", 3},
                                           ParityCase{"moe", 4}, ParityCase{"moe", 8},
                                           ParityCase{"resmlp", 1}, ParityCase{"resmlp", 3},
                                           ParityCase{"resmlp", 8},
                                           // Ranks as processes, over Gloo.
                                           ParityCase{"mlp", 2, RanksAs::Processes},
                                           ParityCase{"moe", 3, RanksAs::Processes},
                                           ParityCase{"resmlp", 4, RanksAs::Processes}),
                         [](const auto& info) {
                           return info.param.kind + "_world" + std::to_string(info.param.world) +
                                  (info.param.as == RanksAs::Processes ? "_processes" : "");
                         });

TEST(ParityOptions, SgdReshardOffSeparateGroupAndMicroBatches) {
  runtime::TrainConfig c = parity_config("moe");
  c.optimizer.kind = "sgd";
  c.reshard_after_forward = false;
  c.separate_rs_group = true;
  c.rs_max_input_buffers = 2;
  c.micro_batches = 2;  // no-sync accumulation on the first micro-batch
  c.prefetch_next_step = true;
  const auto ref = run_reference(c, 3);
  const auto results = run_fsdp(3, c);
  EXPECT_LE(relative_error(results[0].params, ref.params), 1e-6);
}

TEST(ParityOptions, OptimizerInBackwardMatchesTheStepAfterBackward) {
  for (const char* kind : {"mlp", "moe"})
    for (const char* opt : {"adamw", "sgd"}) {
      runtime::TrainConfig c = parity_config(kind);
      c.optimizer.kind = opt;
      const auto ref = run_reference(c, 3);
      c.optimizer_in_backward = true;
      c.prefetch_next_step = true;  // the next step's first all-gather follows the optimizer
      c.rs_max_input_buffers = 2;
      const auto results = run_fsdp(3, c);
      EXPECT_LE(relative_error(results[0].params, ref.params), 1e-6) << kind << " " << opt;
    }
}

TEST(ParityOptions, Bf16ComputeTracksTheFp32Reference) {
  runtime::TrainConfig c = parity_config("mlp");
  const auto ref = run_reference(c, 2);
  c.param_dtype = DType::BF16;
  const auto results = run_fsdp(2, c);
  // bf16 params and activations: ~3 significant digits.
  EXPECT_LE(relative_error(results[0].params, ref.params), 2e-2);
}

}  // namespace
}  // namespace fsdp::testing
