// Full weights out and in: `fsdp export` of a checkpoint holds exactly the trained params
// (fp32, or bf16-rounded), --init-from loads them back on any world size with either naming,
// and the transformer's params map to Hugging Face Llama names (wqkv and w13 split by rows).
#include <gtest/gtest.h>

#include <numeric>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_loader.h"
#include "checkpoint/full_weights.h"
#include "command_util.h"
#include "fsdp/checkpoint.h"
#include "fsdp/error.h"
#include "io/safetensors.h"
#include "test_checkpoint_util.h"
#include "models/model_family.h"

namespace fsdp::testing {
namespace {

std::vector<float> read_tensor(const io::SafetensorsFile& f, const std::string& name) {
  const io::TensorEntry& t = f.at(name);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype == "F32") {
    f.read(t, 0, t.end - t.begin, out.data());
  } else {
    std::vector<uint16_t> h(out.size());
    f.read(t, 0, t.end - t.begin, h.data());
    for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_float(h[i]);
  }
  return out;
}

// The fqns of a model's params, in all_params() order.
std::vector<std::string> fqns_of(Module& root) {
  std::vector<std::string> out;
  root.visit([&](Module& m) {
    for (const auto& p : m.params()) out.push_back(checkpoint::param_fqn(m, *p));
  });
  return out;
}

// Shards the model that `make` builds over `world` ranks (each block, then the root), loads
// `path` into the shards, and gathers the full params back (rank 0's).
std::vector<std::vector<float>> load_and_gather(
    int world, const std::function<std::unique_ptr<Module>(std::vector<Module*>& blocks)>& make,
    const std::string& path, const checkpoint::HfNames& names = {}) {
  std::vector<std::vector<float>> out;
  runtime::run_cpu_ranks(world, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    std::vector<Module*> blocks;
    std::unique_ptr<Module> model = make(blocks);
    Mesh mesh("dp", device, comm);
    for (Module* b : blocks) fully_shard(*b, mesh);
    FsdpModule& root = fully_shard(*model, mesh);
    const Stream s = device.create_stream("load", StreamPriority::Normal);
    device.synchronize();
    checkpoint::load_full_weights(path, checkpoint::collect_sharded_state(root, nullptr), &device, s,
                                  names);
    auto full = gather_full_params(root, s);
    device.synchronize();
    if (rank == 0) out = std::move(full);
  });
  return out;
}

TEST(CheckpointExport, HoldsTheTrainedParamsAndInitFromLoadsThemOnAnyWorldSize) {
  runtime::TrainConfig c = small_config("moe");
  const std::string dir = fresh_dir("export_moe");
  c.checkpoint.save_dir = dir;
  const auto trained = run_fsdp(3, c);
  std::unique_ptr<nn::Model> reference_built = models::build_model(c.model);
  nn::Model& reference = *reference_built;
  const std::vector<std::string> names = fqns_of(reference);
  ASSERT_EQ(names.size(), trained[0].params.size());

  const std::string fp32 = dir + "/model.safetensors", bf16 = dir + "/model-bf16.safetensors";
  export_checkpoint(dir, fp32, DType::F32);
  export_checkpoint(dir, bf16, DType::BF16);
  const io::SafetensorsFile f(fp32), h(bf16);
  ASSERT_EQ(f.tensors().size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(read_tensor(f, names[i]), trained[0].params[i]) << names[i];
    EXPECT_EQ(f.at(names[i]).dtype, "F32");
    EXPECT_EQ(h.at(names[i]).dtype, "BF16");
    std::vector<float> rounded = trained[0].params[i];
    for (float& v : rounded) v = bf16_to_float(float_to_bf16(v));
    EXPECT_EQ(read_tensor(h, names[i]), rounded) << names[i];
  }
  // The round trip: --init-from on 2 ranks (saved on 3) gives the same params, bitwise.
  auto make = [&](std::vector<Module*>& blocks) {
    auto m = models::build_model(c.model);
    blocks = m->blocks();
    return std::unique_ptr<Module>(std::move(m));
  };
  EXPECT_EQ(load_and_gather(2, make, fp32), trained[0].params);
}

// A module that only holds params (the transformer's names and shapes), never run.
class Holder : public Module {
 public:
  Holder() : Module("Holder") {}
  void param(const std::string& name, std::vector<int64_t> shape) {
    const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    add_param(name, std::move(shape), std::vector<float>(static_cast<size_t>(n), 0.0f));
  }
  Holder& child(const std::string& name) { return add_child(name, std::make_unique<Holder>()); }

 protected:
  Tensor forward_impl(RunContext&, const Tensor&) override { FSDP_FAIL("not runnable"); }
  Tensor backward_impl(RunContext&, const Tensor&, bool) override { FSDP_FAIL("not runnable"); }
};

// dim 8, 2 heads and 1 KV head of 4, FFN 12, vocab 11, 2 layers.
std::unique_ptr<Module> tiny_transformer(std::vector<Module*>& blocks) {
  auto root = std::make_unique<Holder>();
  root->child("tok_embeddings").param("weight", {11, 8});
  for (int i = 0; i < 2; ++i) {
    Holder& layer = root->child("layers." + std::to_string(i));
    layer.child("attention_norm").param("weight", {8});
    Holder& attention = layer.child("attention");
    attention.child("wqkv").param("weight", {(2 + 2 * 1) * 4, 8});
    attention.child("wo").param("weight", {8, 2 * 4});
    layer.child("ffn_norm").param("weight", {8});
    Holder& ff = layer.child("feed_forward");
    ff.child("w13").param("weight", {2 * 12, 8});
    ff.child("w2").param("weight", {8, 12});
    blocks.push_back(&layer);
  }
  root->child("norm").param("weight", {8});
  root->child("output").param("weight", {11, 8});
  return root;
}

// The transformer family's Hugging Face names for tiny_transformer's shapes.
checkpoint::HfNames tiny_transformer_names() {
  nn::ModelConfig c;
  c.kind = "transformer";
  c.layers = 2;
  c.dim = 8;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn_dim = 12;
  c.vocab = 11;
  return models::family(c.kind).hf_names(c);
}

TEST(CheckpointExport, TransformerParamsGetLlamaNamesSplitByRowsAndLoadBack) {
  std::vector<Module*> blocks;
  std::unique_ptr<Module> model = tiny_transformer(blocks);
  std::vector<std::vector<float>> values;
  std::vector<checkpoint::FullTensor> tensors;
  const std::vector<std::string> names = fqns_of(*model);
  std::vector<Param*> params = model->all_params();
  for (size_t i = 0; i < params.size(); ++i) {
    values.emplace_back(static_cast<size_t>(params[i]->numel()));
    for (size_t k = 0; k < values.back().size(); ++k) values.back()[k] = 0.001f * k + i;
  }
  for (size_t i = 0; i < params.size(); ++i)
    tensors.push_back({names[i], params[i]->shape(), values[i].data()});
  const std::string dir = fresh_dir("export_llama");
  const std::string llama = dir + "/llama.safetensors";
  checkpoint::write_full_weights(llama, tensors, DType::F32, tiny_transformer_names());

  const io::SafetensorsFile f(llama);
  EXPECT_EQ(f.tensors().size(), 1 + 2 * 9 + 2u);  // wqkv -> 3 tensors, w13 -> 2
  auto rows = [&](size_t param, int64_t first, int64_t count) {
    const int64_t cols = params[param]->cols();
    return std::vector<float>(values[param].begin() + first * cols,
                              values[param].begin() + (first + count) * cols);
  };
  auto index = [&](const std::string& fqn) {
    return static_cast<size_t>(std::find(names.begin(), names.end(), fqn) - names.begin());
  };
  const size_t wqkv = index("layers.1.attention.wqkv.weight"), w13 = index("layers.1.feed_forward.w13.weight");
  EXPECT_EQ(read_tensor(f, "model.layers.1.self_attn.q_proj.weight"), rows(wqkv, 0, 8));
  EXPECT_EQ(read_tensor(f, "model.layers.1.self_attn.k_proj.weight"), rows(wqkv, 8, 4));
  EXPECT_EQ(read_tensor(f, "model.layers.1.self_attn.v_proj.weight"), rows(wqkv, 12, 4));
  EXPECT_EQ(read_tensor(f, "model.layers.1.mlp.gate_proj.weight"), rows(w13, 0, 12));
  EXPECT_EQ(read_tensor(f, "model.layers.1.mlp.up_proj.weight"), rows(w13, 12, 12));
  EXPECT_EQ(f.at("model.layers.1.mlp.down_proj.weight").shape, (std::vector<int64_t>{8, 12}));
  for (const char* n : {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                        "model.layers.0.input_layernorm.weight",
                        "model.layers.0.post_attention_layernorm.weight",
                        "model.layers.0.self_attn.o_proj.weight"})
    EXPECT_NE(f.find(n), nullptr) << n;
  EXPECT_EQ(read_tensor(f, "lm_head.weight"), values[index("output.weight")]);

  // Back in on 3 ranks: rows of q, k, v (and gate, up) land in each rank's wqkv (w13) shard.
  EXPECT_EQ(load_and_gather(3, tiny_transformer, llama, tiny_transformer_names()), values);
  // The same weights under their fqns load too (either naming).
  std::vector<io::TensorToWrite> plain;
  for (size_t i = 0; i < params.size(); ++i)
    plain.push_back({names[i], "F32", params[i]->shape(), values[i].data()});
  io::write_safetensors(dir + "/fqn.safetensors", plain, {});
  EXPECT_EQ(
      load_and_gather(2, tiny_transformer, dir + "/fqn.safetensors", tiny_transformer_names()),
      values);
}

TEST(CheckpointExport, TrainedTransformerExportsLlamaNamesAndInitFromLoadsItBack) {
  runtime::TrainConfig c = small_config("transformer");  // 3 heads, 1 kv head of 6, ffn 21
  const std::string dir = fresh_dir("export_transformer");
  c.checkpoint.save_dir = dir;
  const auto trained = run_fsdp(3, c);
  std::unique_ptr<nn::Model> reference_built = models::build_model(c.model);
  nn::Model& reference = *reference_built;
  const std::vector<std::string> names = fqns_of(reference);
  ASSERT_EQ(names.size(), trained[0].params.size());
  auto trained_rows = [&](const std::string& fqn, int64_t first, int64_t count) {
    const size_t i = static_cast<size_t>(std::find(names.begin(), names.end(), fqn) - names.begin());
    const int64_t cols = c.model.dim;
    const std::vector<float>& v = trained[0].params.at(i);
    return std::vector<float>(v.begin() + first * cols, v.begin() + (first + count) * cols);
  };

  const std::string out = dir + "/model.safetensors";
  export_checkpoint(dir, out, DType::F32);
  const io::SafetensorsFile f(out);
  EXPECT_EQ(f.tensors().size(), 3 + 9 * static_cast<size_t>(c.model.layers));
  for (const auto& t : f.tensors())
    EXPECT_TRUE(t.name == "lm_head.weight" || t.name.rfind("model.", 0) == 0) << t.name;
  const int64_t hd = c.model.dim / c.model.heads;  // 6
  for (int i = 0; i < c.model.layers; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    const std::string fq = "layers." + std::to_string(i) + ".";
    EXPECT_EQ(f.at(l + "self_attn.q_proj.weight").shape, (std::vector<int64_t>{3 * hd, 18}));
    EXPECT_EQ(f.at(l + "self_attn.k_proj.weight").shape, (std::vector<int64_t>{hd, 18}));
    EXPECT_EQ(f.at(l + "self_attn.v_proj.weight").shape, (std::vector<int64_t>{hd, 18}));
    EXPECT_EQ(f.at(l + "mlp.gate_proj.weight").shape, (std::vector<int64_t>{21, 18}));
    EXPECT_EQ(f.at(l + "mlp.down_proj.weight").shape, (std::vector<int64_t>{18, 21}));
    EXPECT_EQ(read_tensor(f, l + "self_attn.q_proj.weight"), trained_rows(fq + "attention.wqkv.weight", 0, 3 * hd));
    EXPECT_EQ(read_tensor(f, l + "self_attn.k_proj.weight"), trained_rows(fq + "attention.wqkv.weight", 3 * hd, hd));
    EXPECT_EQ(read_tensor(f, l + "self_attn.v_proj.weight"), trained_rows(fq + "attention.wqkv.weight", 4 * hd, hd));
    EXPECT_EQ(read_tensor(f, l + "mlp.gate_proj.weight"), trained_rows(fq + "feed_forward.w13.weight", 0, 21));
    EXPECT_EQ(read_tensor(f, l + "mlp.up_proj.weight"), trained_rows(fq + "feed_forward.w13.weight", 21, 21));
    for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight",
                          "self_attn.o_proj.weight"})
      EXPECT_NE(f.find(l + n), nullptr) << l << n;
  }
  EXPECT_EQ(read_tensor(f, "model.embed_tokens.weight"), trained_rows("tok_embeddings.weight", 0, 37));
  EXPECT_EQ(read_tensor(f, "lm_head.weight"), trained_rows("output.weight", 0, 37));
  EXPECT_NE(f.find("model.norm.weight"), nullptr);

  // Back into the real model on 2 ranks (saved on 3): the trained params, bitwise.
  auto make = [&](std::vector<Module*>& blocks) {
    auto m = models::build_model(c.model);
    blocks = m->blocks();
    return std::unique_ptr<Module>(std::move(m));
  };
  EXPECT_EQ(load_and_gather(2, make, out, models::family(c.model.kind).hf_names(c.model)),
            trained[0].params);
  // And through the trainer: training starts from the trained weights, the same on 2 and 4
  // ranks (the same global batch of 12 tokens) within fp32 rounding.
  runtime::TrainConfig from = small_config("transformer");
  from.steps = 2;
  from.checkpoint.init_from = out;
  const auto a = run_fsdp(2, from);
  from.tokens = 3;
  const auto b = run_fsdp(4, from);
  EXPECT_LT(a[0].losses.front(), trained[0].losses.front()) << "init-from must start trained";
  EXPECT_EQ(a[0].losses.size(), 2u);
  EXPECT_NEAR(a[0].losses.front(), b[0].losses.front(), 1e-5f);
}

const std::string kRun = "--backend cpu --world-size 2 --model mlp --layers 2 --tokens 4 ";
const std::string kModel = kRun + "--dim 16 ";

std::vector<float> losses_of(const std::string& json_path) {
  std::ifstream in(json_path);
  return nlohmann::json::parse(in)["losses"].get<std::vector<float>>();
}

TEST(CheckpointExport, InitialWeightsFromTheCommandAreTheModelsOwnAndTrainTheSame) {
  const std::string dir = fresh_dir("export_init");
  const std::string file = dir + "/init.safetensors";
  CommandResult e = run_fsdp_command("export --init " + kModel + "--out " + file);
  ASSERT_EQ(e.code, 0) << e.output;
  nn::ModelConfig mc;
  mc.kind = "mlp";
  mc.layers = 2;
  mc.dim = 16;
  std::unique_ptr<nn::Model> model_built = models::build_model(mc);
  nn::Model& model = *model_built;
  const io::SafetensorsFile f(file);
  const std::vector<std::string> names = fqns_of(model);
  const std::vector<Param*> params = model.all_params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(read_tensor(f, names[i]), params[i]->init_values()) << names[i];

  CommandResult plain = run_fsdp_command("train " + kModel + "--steps 2 --quiet --json " + dir + "/a.json");
  CommandResult loaded = run_fsdp_command("train " + kModel + "--steps 2 --quiet --init-from " +
                                          file + " --json " + dir + "/b.json");
  ASSERT_EQ(plain.code, 0) << plain.output;
  ASSERT_EQ(loaded.code, 0) << loaded.output;
  EXPECT_EQ(losses_of(dir + "/a.json"), losses_of(dir + "/b.json"));
}

TEST(CheckpointExport, BadInitFromFilesGetAOneLineError) {
  const std::string dir = fresh_dir("export_bad");
  const std::string good = dir + "/good.safetensors";
  ASSERT_EQ(run_fsdp_command("export --init " + kModel + "--out " + good).code, 0);
  {  // every tensor of the model (whatever the command's model has), in F16
    const io::SafetensorsFile g(good);
    std::vector<std::vector<uint16_t>> half;
    std::vector<io::TensorToWrite> t;
    for (const auto& e : g.tensors()) half.emplace_back(static_cast<size_t>(e.numel()), 0x3c00);
    for (size_t i = 0; i < g.tensors().size(); ++i)
      t.push_back({g.tensors()[i].name, "F16", g.tensors()[i].shape, half[i].data()});
    io::write_safetensors(dir + "/f16.safetensors", t, {});
  }
  std::filesystem::copy_file(good, dir + "/truncated.safetensors");
  std::filesystem::resize_file(dir + "/truncated.safetensors", std::filesystem::file_size(good) - 7);
  std::vector<float> extra(4, 1.0f);
  const std::string with_extra = dir + "/extra.safetensors";
  {
    const io::SafetensorsFile g(good);
    std::vector<std::vector<float>> v;
    std::vector<io::TensorToWrite> t;
    for (const auto& e : g.tensors()) v.push_back(read_tensor(g, e.name));
    for (size_t i = 0; i < g.tensors().size(); ++i)
      t.push_back({g.tensors()[i].name, "F32", g.tensors()[i].shape, v[i].data()});
    t.push_back({"layers.2.weight", "F32", {2, 2}, extra.data()});
    io::write_safetensors(with_extra, t, {});
  }
  struct Case {
    std::string file, flags, expect;
  };
  for (const Case& c : std::vector<Case>{
           {good, "--dim 24", "another model shape"},
           {dir + "/f16.safetensors", "--dim 16", "expected F32 or BF16"},
           {dir + "/truncated.safetensors", "--dim 16", "truncated"},
           {with_extra, "--dim 16", "that this model does not have"},
           {dir + "/absent.safetensors", "--dim 16", "cannot open"}}) {
    const auto before = snapshot(dir);
    CommandResult r = run_fsdp_command("train " + kRun + c.flags + " --steps 1 --init-from " + c.file);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.file), std::string::npos) << r.output;
    EXPECT_EQ(snapshot(dir), before);
  }
  CommandResult r = run_fsdp_command("export --checkpoint " + dir + " --out " + dir + "/x.safetensors");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("is not a checkpoint"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fsdp::testing
