// The whole training step on the CPU against PyTorch: train_rank trains the tiny Llama-style
// transformer of tests/fixtures/golden_transformer.json (fp32, 1 and 2 ranks) from the fixture's
// weights on its token batches, with AdamW, warm-up and cosine decay, clipping and evaluation;
// the losses, grad norms, lrs and validation losses must be those that
// tests/fixtures/make_golden.py computed with a plain-PyTorch forward, torch.optim.AdamW,
// LambdaLR and clip_grad_norm_ in float64. The weights come from the fixture's rule (written
// to a safetensors file with Hugging Face names and loaded with --init-from), not from the
// engine's init, so the reference shares no code with what it checks.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "fixture_tokens.h"
#include "fsdp/error.h"
#include "golden_fixture.h"
#include "io/safetensors.h"
#include "runtime/batch_source.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

using nlohmann::json;

const json& fixture() {
  static const json j = golden_fixture("golden_transformer.json");
  return j;
}

// The fixture's initial weights, by its rule, in a safetensors file with their Llama names.
std::string write_initial_weights() {
  static const std::string path = [] {
    std::vector<std::vector<float>> values;
    std::vector<io::TensorToWrite> tensors;
    const json& specs = fixture().at("weights");
    values.reserve(specs.size());
    for (const json& w : specs) {
      const auto shape = w.at("shape").get<std::vector<int64_t>>();
      int64_t n = 1;
      for (int64_t v : shape) n *= v;
      values.push_back(golden_rule_values(w.at("salt").get<uint64_t>(), n,
                                          w.at("scale").get<double>(), w.at("offset").get<double>()));
      tensors.push_back({w.at("name").get<std::string>(), "F32", shape, values.back().data()});
    }
    const std::string dir = ::testing::TempDir() + "golden_transformer_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    const std::string file = dir + "/init.safetensors";
    io::write_safetensors(file, tensors, {});
    return file;
  }();
  return path;
}

runtime::TrainConfig golden_config(int world) {
  const json& m = fixture().at("model");
  const json& t = fixture().at("train");
  runtime::TrainConfig c;
  c.model.kind = "transformer";
  c.model.layers = m.at("layers").get<int>();
  c.model.dim = m.at("dim").get<int64_t>();
  c.model.heads = m.at("heads").get<int64_t>();
  c.model.kv_heads = m.at("kv_heads").get<int64_t>();
  c.model.ffn_dim = m.at("ffn_dim").get<int64_t>();
  c.model.vocab = m.at("vocab").get<int64_t>();
  c.model.seq_len = m.at("seq_len").get<int64_t>();
  const int64_t global_tokens = t.at("sequences").get<int64_t>() * c.model.seq_len;
  c.tokens = global_tokens / world;
  c.steps = t.at("steps").get<int>();
  c.optimizer.kind = "adamw";
  c.optimizer.adamw.lr = t.at("lr").get<float>();
  c.optimizer.adamw.beta1 = t.at("betas").at(0).get<float>();
  c.optimizer.adamw.beta2 = t.at("betas").at(1).get<float>();
  c.optimizer.adamw.eps = t.at("eps").get<float>();
  c.optimizer.adamw.weight_decay = t.at("weight_decay").get<float>();
  c.optimizer.max_grad_norm = t.at("max_grad_norm").get<float>();
  c.schedule.kind = t.at("schedule").at("kind").get<std::string>();
  c.schedule.warmup_steps = t.at("schedule").at("warmup_steps").get<int>();
  c.schedule.min_lr = t.at("schedule").at("min_lr").get<float>();
  c.schedule.total_steps = c.steps;
  c.batch_source = [](int, int) { return std::make_unique<FixtureTokens>(fixture().at("train_batches")); };
  c.eval_source = [](int, int) { return std::make_unique<FixtureTokens>(fixture().at("eval_batches")); };
  c.eval_every = t.at("eval_every").get<int>();
  c.eval_batches = t.at("eval_batches").get<int64_t>();
  c.checkpoint.init_from = write_initial_weights();
  return c;
}

// fp32 against float64 over five steps (the README's fp32 parity with PyTorch is ~2e-6).
constexpr double kRel = 1e-5;

void expect_torchs_run(int world) {
  const auto results = run_fsdp(world, golden_config(world));
  const json& f = fixture();
  for (const runtime::RankResult& r : results) {
    const std::string who = "rank " + std::to_string(r.rank) + " of " + std::to_string(world);
    expect_close(r.lrs, f.at("lrs").get<std::vector<double>>(), 3e-7, 0, who + " lr");
    expect_close(r.losses, f.at("losses").get<std::vector<double>>(), kRel, 0, who + " loss");
    expect_close(r.grad_norms, f.at("grad_norms").get<std::vector<double>>(), kRel, 0,
                 who + " grad norm");
    std::vector<float> vals;
    std::vector<double> want;
    ASSERT_EQ(r.val_losses.size(), f.at("val_losses").size()) << who;
    for (size_t i = 0; i < r.val_losses.size(); ++i) {
      EXPECT_EQ(r.val_losses[i].first, f.at("val_losses").at(i).at(0).get<int>()) << who;
      vals.push_back(r.val_losses[i].second);
      want.push_back(f.at("val_losses").at(i).at(1).get<double>());
    }
    expect_close(vals, want, kRel, 0, who + " validation loss");
  }
}

TEST(GoldenTransformer, LossesNormsLrsAndValidationMatchTorchOnOneRank) { expect_torchs_run(1); }

TEST(GoldenTransformer, LossesNormsLrsAndValidationMatchTorchOnTwoRanks) { expect_torchs_run(2); }

// The validation loss of the fixed initial model: one step at an lr too small to move an fp32
// weight, then the mean over the first 1 or 2 eval batches, each averaged over the ranks.
TEST(GoldenValidation, InitialModelsMeanOverFixedBatchesMatchesTorch) {
  const auto per_batch = fixture().at("initial_eval_batch_losses").get<std::vector<double>>();
  for (int world : {1, 2})
    for (int64_t batches : {1, 2}) {
      runtime::TrainConfig c = golden_config(world);
      c.steps = 1;
      c.schedule.total_steps = 1;
      c.schedule.warmup_steps = 0;
      c.optimizer.adamw.lr = 1e-30f;
      c.optimizer.adamw.weight_decay = 0;
      c.eval_every = 1;
      c.eval_batches = batches;
      double want = 0;
      for (int64_t k = 0; k < batches; ++k) want += per_batch[static_cast<size_t>(k)] / batches;
      const auto r = run_fsdp(world, c);
      for (const runtime::RankResult& rank : r) {
        ASSERT_EQ(rank.val_losses.size(), 1u);
        expect_close({rank.val_losses[0].second}, {want}, kRel, 0,
                     std::to_string(batches) + " batches on " + std::to_string(world) + " ranks");
      }
    }
}

}  // namespace
}  // namespace fsdp::testing
