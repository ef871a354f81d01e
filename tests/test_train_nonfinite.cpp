// Note [Non-finite steps]: a non-finite loss or grad norm stops the run at that step, names
// it (and the unit whose gradient it was), and the rest of the run still reports what it did.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "fsdp/error.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig small_mlp() {
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 3;
  c.model.dim = 16;
  c.model.classes = 4;
  c.tokens = 4;
  c.steps = 6;
  c.optimizer.max_grad_norm = 1.0f;
  return c;
}

// A NaN written into layers.1's grad shard after step 3's backward (0-based step 2).
void poison_layer1_grad(runtime::TrainState& s) {
  if (s.next_step != 2) return;
  for (const ShardedGroupView& g : sharded_groups(s.root))
    if (g.name == "layers.1")
      s.device.fill(s.compute, g.grad, DType::F32, 1,
                                        std::numeric_limits<float>::quiet_NaN());
}

TEST(TrainNonFinite, AnInjectedNanGradientStopsAtItsStepNamingTheUnit) {
  for (int world : {1, 2}) {
    runtime::TrainConfig c = small_mlp();
    c.after_backward = poison_layer1_grad;
    c.return_on_nonfinite = true;
    const auto results = run_fsdp(world, c);
    for (const auto& r : results) {
      EXPECT_EQ(r.failed_step, 2);
      EXPECT_EQ(r.losses.size(), 2u);  // the steps before it
      EXPECT_NE(r.error.find("step 3"), std::string::npos) << r.error;
      EXPECT_NE(r.error.find("layers.1"), std::string::npos) << r.error;
    }
    c.return_on_nonfinite = false;
    EXPECT_THROW(run_fsdp(world, c), UserError);
  }
}

TEST(TrainNonFinite, ANanLossStopsAtItsStep) {
  runtime::TrainConfig c = small_mlp();
  c.return_on_nonfinite = true;
  // A NaN weight from step 4 on (0-based 3): its forward makes a NaN loss.
  c.after_step = [](runtime::TrainState& s) {
    if (s.next_step != 3) return;
    for (const ShardedGroupView& g : sharded_groups(s.root))
      if (g.name == "layers.0")
        s.device.fill(s.compute, g.param, DType::F32, 1,
                                          std::numeric_limits<float>::quiet_NaN());
  };
  for (const auto& r : run_fsdp(2, c)) {
    EXPECT_EQ(r.failed_step, 3);
    EXPECT_NE(r.error.find("step 4: the loss is"), std::string::npos) << r.error;
  }
}

TEST(TrainNonFinite, HugeLrOnTheCommandExitsNonZeroAndStillWritesTheSummary) {
  const std::string json = ::testing::TempDir() + "nonfinite_summary.json";
  std::remove(json.c_str());
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --lr 1e6 --steps 8 --quiet --json " + json);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.code, -1) << "crashed: " << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("error: step "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << "no summary written";
  const nlohmann::json s = nlohmann::json::parse(in);
  ASSERT_TRUE(s.contains("failed_step"));
  EXPECT_EQ(s["losses"].size(), s["failed_step"].get<size_t>() - 1);
  for (const auto& v : s["losses"]) EXPECT_TRUE(v.is_number());
}

}  // namespace
}  // namespace fsdp::testing
