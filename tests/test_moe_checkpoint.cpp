// Checkpoints and full weights of the MoE transformer with expert parallelism (Note [Expert
// params in checkpoints] in src/checkpoint/sharded_state.h): a checkpoint saved on ep 2 x
// efsdp 2 holds every expert once, resumes bitwise on the same layout and within fp32 rounding
// on another ep; `fsdp export` writes every expert as trained; `fsdp export --init` writes
// every expert's initial weights, which --init-from loads on any ep.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/full_weights.h"
#include "models/initial_weights.h"
#include "checkpoint/sharded_state.h"
#include "fsdp/checkpoint.h"
#include "io/safetensors.h"
#include "test_checkpoint_util.h"
#include "models/model_family.h"

namespace fsdp::testing {
namespace {

// 6 experts: 3 per ep rank on ep 2, which split 2 + 1 over efsdp 2 (uneven, padded).
runtime::TrainConfig moe_checkpoint_config(int ep) {
  return tiny_moe_transformer_config(ep, /*experts=*/6, /*steps=*/6);
}

std::vector<float> read_tensor(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorEntry& t = f.at(name);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  EXPECT_EQ(t.dtype, "F32") << name;
  f.read(t, 0, t.end - t.begin, out.data());
  return out;
}

// The unsharded model's fqns and shapes (every expert), in all_params() order.
std::vector<std::pair<std::string, std::vector<int64_t>>> params_of(const runtime::TrainConfig& c) {
  nn::ModelConfig m = c.model;
  m.ep = 1;
  std::unique_ptr<nn::Model> model_built = models::build_model(m);
  nn::Model& model = *model_built;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  model.visit([&](Module& mod) {
    for (const auto& p : mod.params()) out.push_back({checkpoint::param_fqn(mod, *p), p->shape()});
  });
  return out;
}

TEST(MoeCheckpoint, TrainedParamsHoldEveryExpertOnEveryRank) {
  // gather_full_params gives a rank its E / ep experts; the trainer adds the other ep ranks'.
  const runtime::TrainConfig c = moe_checkpoint_config(2);
  const auto results = run_fsdp(4, c);
  const auto ref = run_reference(c, 4);
  const auto shapes = params_of(c);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(results[r].params.size(), shapes.size());
    for (size_t i = 0; i < shapes.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : shapes[i].second) n *= d;
      EXPECT_EQ(static_cast<int64_t>(results[r].params[i].size()), n) << shapes[i].first;
    }
    EXPECT_EQ(results[r].params, results[0].params) << "rank " << r;
  }
  // In global expert order: the unsharded reference's params, within fp32 rounding.
  EXPECT_LE(relative_error(results[0].params, ref.params), 1e-5);
}

TEST(MoeCheckpoint, SavedOnEp2xEfsdp2HoldsEveryExpertOnceAndResumesBitwise) {
  const runtime::TrainConfig c = moe_checkpoint_config(2);
  const auto plain = run_fsdp(4, c);  // no checkpoints

  const std::string dir = fresh_dir("moe_resume_ep2");
  runtime::TrainConfig saving = c;
  saving.checkpoint.save_dir = dir;
  saving.checkpoint.save_every = 4;
  const auto full = run_fsdp(4, saving);
  EXPECT_EQ(full[0].losses, plain[0].losses) << "saving changed the training";

  // The index: every expert param is the global [E, ...] tensor, its rows held once.
  const nlohmann::json index = nlohmann::json::parse(read_file(dir + "/step-000004/index.json"));
  int expert_tensors = 0;
  for (const nlohmann::json& t : index.at("tensors")) {
    const std::string name = t.at("name");
    if (name.find(".moe.experts.") == std::string::npos) continue;
    ++expert_tensors;
    EXPECT_EQ(t.at("shape")[0], 6) << name;
    std::vector<int> holders(6, 0);
    for (const nlohmann::json& range : t.at("ranks"))
      for (int64_t row = range[0]; row < range[1]; ++row) ++holders.at(static_cast<size_t>(row));
    EXPECT_EQ(holders, std::vector<int>(6, 1)) << name;
  }
  EXPECT_EQ(expert_tensors, 2);  // w13 and w2 of layer 1

  runtime::TrainConfig resumed = c;
  resumed.checkpoint.resume = dir + "/step-000004";
  const auto rest = run_fsdp(4, resumed);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(rest[r].losses.size(), 2u);
    EXPECT_EQ(rest[r].losses[0], full[r].losses[4]) << "rank " << r;
    EXPECT_EQ(rest[r].losses[1], full[r].losses[5]) << "rank " << r;
    EXPECT_EQ(rest[r].params, full[r].params) << "rank " << r << ": resume must be bitwise identical";
  }
}

// ep 2 -> 1 on the same world: the same global batch and routing groups (a rank's tokens), so
// the same training up to the order of fp32 sums.
TEST(MoeCheckpoint, ResumesOnAnotherEpLayout) {
  const std::string dir = fresh_dir("moe_resume_ep2_to_1");
  runtime::TrainConfig saving = moe_checkpoint_config(2);
  saving.checkpoint.save_dir = dir;
  saving.checkpoint.save_every = 3;
  const auto full = run_fsdp(4, saving);

  runtime::TrainConfig resumed = moe_checkpoint_config(1);
  resumed.checkpoint.resume = dir + "/step-000003";
  const auto rest = run_fsdp(4, resumed);
  ASSERT_EQ(rest[0].losses.size(), 3u);
  for (int s = 0; s < 3; ++s)
    EXPECT_NEAR(rest[0].losses[s], full[0].losses[3 + s], 1e-5 * std::abs(full[0].losses[3 + s]));
  EXPECT_LE(relative_error(rest[0].params, full[0].params), 1e-5);
}

TEST(MoeCheckpoint, ExportWritesEveryExpertAsTrained) {
  const std::string dir = fresh_dir("moe_export_ep2");
  runtime::TrainConfig c = moe_checkpoint_config(2);
  c.checkpoint.save_dir = dir;
  const auto trained = run_fsdp(4, c);
  const std::string out = dir + "/model.safetensors";
  export_checkpoint(dir, out, DType::F32);
  const io::SafetensorsFile f(out);
  const auto shapes = params_of(c);
  std::set<std::string> seen;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const std::string& fqn = shapes[i].first;
    if (fqn.find(".moe.") == std::string::npos) continue;  // dense params: Llama names
    EXPECT_EQ(f.at(fqn).shape, shapes[i].second) << fqn;  // every expert: [6, ...]
    EXPECT_EQ(read_tensor(f, fqn), trained[0].params[i]) << fqn;
    seen.insert(fqn);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"layers.1.moe.router.weight", "layers.1.moe.experts.w13",
                                         "layers.1.moe.experts.w2"}));
  EXPECT_EQ(read_tensor(f, "model.embed_tokens.weight"), trained[0].params[0]);
}

TEST(MoeCheckpoint, ExportInitWritesEveryExpertAndInitFromLoadsItOnAnyEp) {
  const std::string dir = fresh_dir("moe_export_init");
  runtime::TrainConfig c = moe_checkpoint_config(2);
  const std::string init = dir + "/init.safetensors";
  models::export_initial_weights(c.model, init, DType::F32);  // --ep 2 on the command line
  const io::SafetensorsFile f(init);
  nn::ModelConfig all = c.model;
  all.ep = 1;
  std::unique_ptr<nn::Model> model_built = models::build_model(all);
  nn::Model& model = *model_built;
  for (Param* p : model.all_params())
    if (p->shape().size() == 3) {  // the experts: every one of the 6
      const std::string fqn = "layers.1.moe.experts." + p->name();
      EXPECT_EQ(read_tensor(f, fqn), p->init_values()) << fqn;
    }
  // Loading the initial weights changes nothing, on ep 2 as on ep 1.
  c.steps = 2;
  const auto plain = run_fsdp(4, c);
  runtime::TrainConfig loaded = c;
  loaded.checkpoint.init_from = init;
  EXPECT_EQ(run_fsdp(4, loaded)[0].losses, plain[0].losses);
  loaded.model.ep = 1;
  const auto ep1 = run_fsdp(4, loaded);
  for (int s = 0; s < 2; ++s)
    EXPECT_NEAR(ep1[0].losses[s], plain[0].losses[s], 1e-5 * std::abs(plain[0].losses[s]));
}

}  // namespace
}  // namespace fsdp::testing
