// The training recipe: the schedule's values, clipping against the unsharded reference on 1, 2
// and 4 ranks (dense and expert meshes), and the command's defaults training every model.
#include <gtest/gtest.h>

#include <cmath>

#include "fsdp/error.h"
#include "optim/lr_schedule.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

TEST(LrSchedule, WarmsUpLinearlyThenDecaysByCosineToMinLr) {
  optim::LrSchedule s;
  s.kind = "cosine";
  s.warmup_steps = 4;
  s.min_lr = 0.1f;
  s.total_steps = 14;
  EXPECT_FLOAT_EQ(s.at(0, 1.0f), 0.25f);
  EXPECT_FLOAT_EQ(s.at(3, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(s.at(4, 1.0f), 1.0f);                        // the decay starts at the peak
  EXPECT_NEAR(s.at(9, 1.0f), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 5 / 9)), 1e-6);
  EXPECT_FLOAT_EQ(s.at(13, 1.0f), 0.1f);                       // min_lr at the last step
  s.kind = "linear";
  EXPECT_NEAR(s.at(8, 1.0f), 0.1 + 0.9 * (1 - 4.0 / 9), 1e-6);
  s.kind = "constant";
  EXPECT_FLOAT_EQ(s.at(1, 2.0f), 1.0f);                        // warm-up still applies
  EXPECT_FLOAT_EQ(s.at(10, 2.0f), 2.0f);
}

TEST(LrSchedule, BadValuesAreUserErrors) {
  optim::LrSchedule s;
  EXPECT_THROW(optim::validate(s, -1.0f), UserError);
  s.min_lr = 2.0f;
  EXPECT_THROW(optim::validate(s, 1.0f), UserError);
  s.min_lr = 0;
  s.kind = "step";
  EXPECT_THROW(optim::validate(s, 1.0f), UserError);
}

// Small enough for exact parity, clipped hard enough that every step clips.
runtime::TrainConfig clipped_config(const std::string& kind) {
  runtime::TrainConfig c;
  c.model.kind = kind;
  c.model.layers = 3;
  c.model.dim = 17;  // odd: shards are padded, and the padding must not count
  c.model.hidden = 33;
  c.model.experts = 3;
  c.model.classes = 5;
  c.model.norm = true;
  c.tokens = 6;
  c.steps = 5;
  c.collect_params = true;
  c.optimizer.adamw.lr = 1e-2f;
  c.optimizer.max_grad_norm = 0.05f;
  c.schedule.kind = "cosine";
  c.schedule.warmup_steps = 2;
  c.schedule.min_lr = 1e-3f;
  c.schedule.total_steps = c.steps;
  return c;
}

// Note [Global grad norm]: the moe's expert groups shard over their own mesh; a norm that
// summed them on both meshes (or left them out) would differ from the reference's.
TEST(TrainClipping, ShardedRunsMatchTheUnshardedReferenceOn1To4Ranks) {
  for (const char* kind : {"mlp", "resmlp", "moe"})
    for (int world : {1, 2, 4}) {
      const runtime::TrainConfig c = clipped_config(kind);
      const runtime::RankResult ref = run_reference(c, world);
      ASSERT_EQ(ref.grad_norms.size(), 5u);
      for (float n : ref.grad_norms) EXPECT_GT(n, 2 * c.optimizer.max_grad_norm) << "clipping is on";
      const auto results = run_fsdp(world, c);
      for (const auto& r : results) {
        ASSERT_EQ(r.grad_norms.size(), ref.grad_norms.size());
        for (size_t s = 0; s < ref.grad_norms.size(); ++s) {
          EXPECT_NEAR(r.grad_norms[s], ref.grad_norms[s], 1e-5 * ref.grad_norms[s])
              << kind << " world " << world << " step " << s;
          EXPECT_NEAR(r.losses[s], ref.losses[s], 1e-5 * std::abs(ref.losses[s]));
          EXPECT_FLOAT_EQ(r.lrs[s], c.schedule.at(static_cast<int>(s), c.optimizer.adamw.lr));
        }
      }
      EXPECT_LE(relative_error(results[0].params, ref.params), 2e-5) << kind << " world " << world;
    }
}

TEST(TrainClipping, ClippingChangesTheStepAndSgdClipsToo) {
  runtime::TrainConfig c = clipped_config("mlp");
  const runtime::RankResult clipped = run_reference(c, 2);
  c.optimizer.max_grad_norm = 0;
  const runtime::RankResult free = run_reference(c, 2);
  EXPECT_GT(relative_error(clipped.params, free.params), 1e-3);  // the clip did something
  c.optimizer.kind = "sgd";
  c.optimizer.sgd_lr = 0.5f;
  c.optimizer.max_grad_norm = 0.05f;
  const runtime::RankResult ref = run_reference(c, 2);
  EXPECT_LE(relative_error(run_fsdp(2, c)[0].params, ref.params), 2e-5);
}

TEST(TrainClipping, TheOptimizerInBackwardRefusesToClip) {
  runtime::TrainConfig c = clipped_config("mlp");
  c.optimizer_in_backward = true;
  EXPECT_THROW(run_fsdp(2, c), UserError);
}

// The same micro-batch every step, so the loss measures the fit, not the batch's luck.
class RepeatedBatch final : public runtime::BatchSource {
 public:
  explicit RepeatedBatch(std::unique_ptr<runtime::BatchSource> inner) : inner_(std::move(inner)) {}
  runtime::DeviceBatch make(Device& d, Stream s, int64_t, int64_t first_row, int64_t rows,
                            DType t) override {
    return inner_->make(d, s, 0, first_row, rows, t);
  }

 private:
  std::unique_ptr<runtime::BatchSource> inner_;
};

// The command's recipe (Note [Command defaults]) at dim 2048 on the CPU: a few steps on one
// batch, and the loss falls for every model.
runtime::TrainConfig command_recipe(const std::string& kind) {
  runtime::TrainConfig c;
  c.model.kind = kind;
  c.model.layers = 2;
  c.model.dim = 2048;
  c.model.hidden = kind == "resmlp" ? 512 : 256;
  c.model.experts = 2;
  c.model.classes = 16;
  c.model.norm = true;
  c.tokens = 8;
  c.steps = 4;
  c.optimizer.adamw.lr = optim::default_adamw_lr(c.model.dim);
  c.optimizer.max_grad_norm = 1.0f;
  c.schedule.kind = "cosine";
  c.schedule.warmup_steps = c.steps / 10;
  c.schedule.min_lr = c.optimizer.adamw.lr / 10;
  c.schedule.total_steps = c.steps;
  return c;
}

TEST(TrainRecipe, EveryModelLearnsAtDim2048) {
  for (const char* kind : {"mlp", "resmlp", "moe"}) {
    runtime::TrainConfig c = command_recipe(kind);
    c.batch_source = [model = c.model, seed = c.seed](int, int) {
      return std::make_unique<RepeatedBatch>(runtime::make_synthetic_features(model, seed));
    };
    const auto results = run_fsdp(2, c);
    const std::vector<float>& l = results[0].losses;
    ASSERT_EQ(l.size(), 4u) << kind;
    for (size_t s = 1; s < l.size(); ++s) EXPECT_LT(l[s], l[s - 1]) << kind << " step " << s;
    for (float v : l) EXPECT_TRUE(std::isfinite(v)) << kind;
    EXPECT_LT(l.back(), l.front()) << kind;
    EXPECT_LT(l.back(), 2 * std::log(16.0f)) << kind << ": O(1) cross-entropy over 16 classes";
  }
}

// Before the He init and the classes target, the 64-layer mlp's loss was mean(y^2) = 0.
TEST(TrainRecipe, Mlp64LayersHasAnOrderOneLossThatFalls) {
  runtime::TrainConfig c = command_recipe("mlp");
  c.model.layers = 64;
  c.model.dim = 64;
  c.tokens = 32;
  c.steps = 8;
  c.schedule.total_steps = c.steps;
  const auto results = run_fsdp(2, c);
  const std::vector<float>& l = results[0].losses;
  EXPECT_GT(l.front(), 0.5f);
  EXPECT_LT(l.front(), 10.0f);
  EXPECT_LT(l.back(), l.front());
}

}  // namespace
}  // namespace fsdp::testing
