// Note [Tied embeddings]: the transformer's head using the embedding's weight. One sharded
// param in the root unit, its gradient the sum of the head's and the embedding's: parity with
// the unsharded reference on 1, 2 and 4 ranks, with micro-batches and in bf16; the gradient
// against the untied model with both weights equal (the sum of its two grads); checkpoints
// and Hugging Face files without lm_head.weight.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "checkpoint/sharded_state.h"
#include "command_util.h"
#include "fsdp/checkpoint.h"
#include "io/safetensors.h"
#include "models/initial_weights.h"
#include "models/model_family.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig tied_config(int steps) {
  runtime::TrainConfig c = tiny_transformer_config(steps);
  c.model.tie_embeddings = true;
  c.optimizer.adamw.lr = 3e-3f;
  return c;
}

std::vector<std::string> fqns_of(const nn::ModelConfig& m) {
  std::vector<std::string> out;
  models::build_model(m)->visit([&](Module& mod) {
    for (const auto& p : mod.params()) out.push_back(checkpoint::param_fqn(mod, *p));
  });
  return out;
}

TEST(TiedEmbeddings, OneParamFewerAndTheHeadStillCountsAsAGemm) {
  runtime::TrainConfig c = tied_config(1);
  nn::ModelConfig untied = c.model;
  untied.tie_embeddings = false;
  const std::vector<std::string> names = fqns_of(c.model);
  EXPECT_EQ(std::count(names.begin(), names.end(), "output.weight"), 0);
  EXPECT_EQ(fqns_of(untied).size(), names.size() + 1);
  const int64_t vd = c.model.vocab * c.model.dim;
  EXPECT_EQ(
      models::build_model(untied)->param_count() - models::build_model(c.model)->param_count(), vd);
  // 6 x the GEMM params either way: the tied head's GEMM uses the embedding's weight.
  EXPECT_DOUBLE_EQ(models::flops_per_token(c.model), models::flops_per_token(untied));
}

class TiedParity : public ::testing::TestWithParam<int> {};

TEST_P(TiedParity, ShardedMatchesTheUnshardedReference) {
  const int world = GetParam();
  const runtime::TrainConfig c = tied_config(4);
  const runtime::RankResult ref = run_reference(c, world);
  const auto results = run_fsdp(world, c);
  ASSERT_EQ(results[0].params.size(), ref.params.size());
  EXPECT_LE(relative_error(results[0].params, ref.params), 1e-6) << "world " << world;
  for (int s = 0; s < c.steps; ++s)
    EXPECT_NEAR(results[0].losses[s], ref.losses[s], 1e-6 * std::abs(ref.losses[s]));
  for (int r = 1; r < world; ++r) EXPECT_EQ(results[r].params, results[0].params);
  if (world == 1) {
    EXPECT_EQ(results[0].params, ref.params) << "world 1 should be bitwise equal";
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, TiedParity, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(TiedEmbeddings, MicroBatchesOptimizerInBackwardAndBf16) {
  runtime::TrainConfig c = tied_config(3);
  c.micro_batches = 2;  // no-sync accumulation of each micro-batch's two contributions
  const auto ref = run_reference(c, 2);
  EXPECT_LE(relative_error(run_fsdp(2, c)[0].params, ref.params), 1e-6);
  c.micro_batches = 1;
  const auto ref1 = run_reference(c, 2);
  c.optimizer_in_backward = true;  // the update follows the second contribution
  c.optimizer.max_grad_norm = 0;
  EXPECT_LE(relative_error(run_fsdp(2, c)[0].params, run_reference(c, 2).params), 1e-6);
  c.optimizer_in_backward = false;
  c.optimizer.max_grad_norm = 1.0f;
  c.param_dtype = DType::BF16;
  EXPECT_LE(relative_error(run_fsdp(2, c)[0].params, ref1.params), 1e-2);
}

// The initial weights of `m` in a file with Hugging Face names; `head` adds lm_head.weight
// equal to the embedding.
std::string initial_weights(const nn::ModelConfig& m, const std::string& path, bool head) {
  nn::ModelConfig untied = m;
  untied.tie_embeddings = false;
  const std::string all = path + ".all";
  models::export_initial_weights(untied, all, DType::F32);
  const io::SafetensorsFile f(all);
  std::vector<std::vector<float>> values;
  std::vector<io::TensorToWrite> out;
  values.reserve(f.tensors().size());
  for (const io::TensorEntry& t : f.tensors()) {
    if (t.name == "lm_head.weight") continue;
    values.emplace_back(static_cast<size_t>(t.numel()));
    f.read(t, 0, t.end - t.begin, values.back().data());
    out.push_back({t.name, "F32", t.shape, values.back().data()});
    if (head && t.name == "model.embed_tokens.weight")
      out.push_back({"lm_head.weight", "F32", t.shape, values.back().data()});
  }
  io::write_safetensors(path, out, {});
  return path;
}

// d(loss)/dW of the tied model is the untied model's d/d(embedding) + d/d(head) when both
// of its weights are W: one SGD step of lr 1 moves W by minus that sum.
TEST(TiedEmbeddings, GradientIsTheSumOfTheEmbeddingsAndTheHeads) {
  const std::string dir = fresh_dir("tied_gradient");
  runtime::TrainConfig c = tied_config(1);
  c.optimizer.kind = "sgd";
  c.optimizer.sgd_lr = 1.0f;
  c.optimizer.sgd_momentum = 0;
  c.optimizer.sgd_weight_decay = 0;
  c.optimizer.max_grad_norm = 0;
  c.schedule.kind = "constant";
  c.schedule.total_steps = 1;
  runtime::TrainConfig u = c;
  u.model.tie_embeddings = false;
  c.checkpoint.init_from = initial_weights(c.model, dir + "/tied.safetensors", false);
  u.checkpoint.init_from = initial_weights(c.model, dir + "/untied.safetensors", true);
  const std::vector<std::string> tied_names = fqns_of(c.model), untied_names = fqns_of(u.model);
  auto at = [](const std::vector<std::string>& names, const std::string& fqn) {
    return static_cast<size_t>(std::find(names.begin(), names.end(), fqn) - names.begin());
  };
  const io::SafetensorsFile f(c.checkpoint.init_from);
  std::vector<float> w(static_cast<size_t>(f.at("model.embed_tokens.weight").numel()));
  f.read(f.at("model.embed_tokens.weight"), 0, w.size() * 4, w.data());
  for (int world : {1, 2}) {
    c.tokens = u.tokens = 32 / world;
    const auto tied = run_fsdp(world, c), untied = run_fsdp(world, u);
    const std::vector<float>& t = tied[0].params[at(tied_names, "tok_embeddings.weight")];
    const std::vector<float>& e = untied[0].params[at(untied_names, "tok_embeddings.weight")];
    const std::vector<float>& h = untied[0].params[at(untied_names, "output.weight")];
    std::vector<std::vector<float>> got(1), want(1);
    double head_part = 0, embedding_part = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      got[0].push_back(w[i] - t[i]);
      want[0].push_back((w[i] - e[i]) + (w[i] - h[i]));
      embedding_part += std::fabs(w[i] - e[i]);
      head_part += std::fabs(w[i] - h[i]);
    }
    EXPECT_GT(embedding_part, 0) << "world " << world;
    EXPECT_GT(head_part, 0) << "world " << world;
    EXPECT_LE(relative_error(got, want), 1e-5) << "world " << world;
    EXPECT_NEAR(tied[0].losses[0], untied[0].losses[0], 1e-6) << "world " << world;
  }
}

TEST(TiedEmbeddings, CheckpointsAndExportsHoldOneTensorAndLoadBack) {
  const std::string dir = fresh_dir("tied_export");
  runtime::TrainConfig c = tied_config(2);
  c.checkpoint.save_dir = dir;
  const auto trained = run_fsdp(2, c);
  const std::string out = dir + "/model.safetensors";
  export_checkpoint(dir, out, DType::F32);
  const io::SafetensorsFile f(out);
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);
  EXPECT_NE(f.find("model.embed_tokens.weight"), nullptr);
  // Back in on 4 ranks through --init-from: an lr too small to move an fp32 weight keeps the
  // loaded params, which are the trained ones.
  runtime::TrainConfig from = tied_config(1);
  from.tokens = 8;
  from.optimizer.adamw.lr = 1e-30f;
  from.optimizer.adamw.weight_decay = 0;
  from.checkpoint.init_from = out;
  EXPECT_EQ(run_fsdp(4, from)[0].params, trained[0].params);
  // An untied model needs lm_head.weight; a tied one refuses a file that has it.
  from.model.tie_embeddings = false;
  try {
    run_fsdp(2, from);
    ADD_FAILURE() << "an untied model loaded a file without lm_head.weight";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor 'lm_head.weight'"), std::string::npos)
        << e.what();
  }
}

TEST(TiedEmbeddings, TheCommandTrainsATiedModel) {
  const std::string json = fresh_dir("tied_cli") + "/summary.json";
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 2 --model transformer --layers 2 --dim 32 --heads 4 "
      "--kv-heads 2 --ffn-dim 40 --seq-len 8 --vocab 61 --tokens 16 --steps 20 --lr 1e-2 "
      "--tie-embeddings --quiet --json " +
      json);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(json);
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_NEAR(s["loss_first"].get<double>(), std::log(61.0), 0.1);
  EXPECT_LT(s["loss_last"].get<double>(), s["loss_first"].get<double>());
}

}  // namespace
}  // namespace fsdp::testing
