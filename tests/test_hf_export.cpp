// `fsdp export --hf DIR`: a checkpoint as a Hugging Face model directory (config.json,
// generation_config.json, shards of --max-shard-size and their index, bf16 by default) that
// --init-from reads back as the same model with the same params; refusals in one line, with
// nothing written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "checkpoint/weight_files.h"
#include "command_util.h"
#include "fsdp/checkpoint.h"
#include "io/safetensors.h"
#include "models/hf_config.h"
#include "models/model_family.h"
#include "test_checkpoint_util.h"
#include "tools/export_command.h"

namespace fsdp::testing {
namespace {

using nlohmann::json;

// A Qwen2-like model (q/k/v biases, tied head) with llama3 rope scaling and a head width of
// its own, trained on 2 ranks with a checkpoint in `dir`.
runtime::TrainConfig qwen_like(const std::string& dir) {
  runtime::TrainConfig c = tiny_transformer_config(2);
  c.model.attention_bias = true;
  c.model.tie_embeddings = true;
  c.model.head_dim = 6;
  c.model.rope_theta = 1e6;
  c.model.rope_scaling.type = "llama3";
  c.model.rope_scaling.original_max_positions = 4;
  c.model.norm_eps = 1e-6;
  c.optimizer.adamw.lr = 3e-3f;
  c.checkpoint.save_dir = dir;
  return c;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(HfExport, ADirectoryThatReadsBackAsTheSameModelAndParams) {
  const std::string dir = fresh_dir("hf_export");
  const runtime::TrainConfig c = qwen_like(dir + "/ckpt");
  const auto trained = run_fsdp(2, c);
  const std::string out = dir + "/hf";
  export_checkpoint_hf(dir + "/ckpt", out, DType::F32, 4000);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors.index.json"})
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  const json config = read_json(out + "/config.json");
  EXPECT_EQ(config["model_type"], "qwen2");
  EXPECT_EQ(config["head_dim"], 6);
  EXPECT_EQ(config["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["torch_dtype"], "float32");
  // Shards of at most 4000 bytes unless a tensor is larger, each tensor in the one the index
  // names, and no lm_head.weight (tied).
  const json index = read_json(out + "/model.safetensors.index.json");
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items())
    shards.insert(file.get<std::string>());
  EXPECT_GT(shards.size(), 2u);
  uint64_t total = 0;
  for (const std::string& s : shards) {
    const io::SafetensorsFile f(out + "/" + s);
    uint64_t bytes = 0;
    for (const auto& t : f.tensors()) bytes += t.end - t.begin;
    EXPECT_TRUE(bytes <= 4000 || f.tensors().size() == 1) << s << " " << bytes;
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].count("lm_head.weight"), 0u);
  EXPECT_EQ(index["weight_map"].count("model.layers.1.self_attn.k_proj.bias"), 1u);

  // config.json reads back as the model that was trained.
  nn::ModelConfig back;
  models::apply_hf_config(out + "/config.json", back);
  back.seq_len = c.model.seq_len;
  back.seed = c.model.seed;
  EXPECT_EQ(models::family(back.kind).shape_fields(back),
            models::family(c.model.kind).shape_fields(models::resolved(c.model)));
  // And the weights: --init-from the directory on 3 ranks, at an lr too small to move an fp32
  // weight, keeps the trained params.
  runtime::TrainConfig from = tiny_transformer_config(1);
  from.model = back;
  from.tokens = 8;
  from.optimizer.adamw.lr = 1e-30f;
  from.optimizer.adamw.weight_decay = 0;
  from.checkpoint.init_from = out;
  EXPECT_EQ(run_fsdp(3, from)[0].params, trained[0].params);
}

TEST(HfExport, TheCommandWritesBf16ByDefaultAndRefusesInOneLine) {
  const std::string dir = fresh_dir("hf_export_cli");
  run_fsdp(2, qwen_like(dir + "/ckpt"));
  const CommandResult r = run_fsdp_command("export --checkpoint " + dir + "/ckpt --hf " + dir +
                                           "/hf --max-shard-size 3KB");
  ASSERT_EQ(r.code, 0) << r.output;
  const checkpoint::WeightFiles files(dir + "/hf");
  for (const std::string& name : files.names()) EXPECT_EQ(files.find(name)->dtype, "BF16") << name;
  EXPECT_EQ(read_json(dir + "/hf/config.json")["torch_dtype"], "bfloat16");
  const CommandResult t = run_fsdp_command(
      "train --backend cpu --world-size 2 --seq-len 8 --tokens 16 --steps 1 --quiet --init-from " +
      dir + "/hf");
  EXPECT_EQ(t.code, 0) << t.output;
  // An --init export of the flags' model, in one shard: model.safetensors, no index.
  const CommandResult init = run_fsdp_command(
      "export --init --model transformer --layers 2 --dim 32 --heads 4 --vocab 61 --seq-len 8 "
      "--tie-embeddings --hf " +
      dir + "/init");
  ASSERT_EQ(init.code, 0) << init.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/init/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/init/model.safetensors.index.json"));
  EXPECT_EQ(read_json(dir + "/init/config.json")["model_type"], "llama");

  struct Case {
    std::string args, expect;
  };
  std::filesystem::create_directories(dir + "/full");
  std::ofstream(dir + "/full/x") << "x";
  for (const Case& c : std::vector<Case>{
           {"--checkpoint " + dir + "/ckpt --hf " + dir + "/full", "is not an empty directory"},
           {"--checkpoint " + dir + "/ckpt --hf " + dir + "/new --max-shard-size 5XB",
            "--max-shard-size must be a size"},
           {"--checkpoint " + dir + "/ckpt --hf " + dir + "/new --out " + dir + "/x.safetensors",
            "exactly one of --out FILE and --hf DIR"},
           {"--init --model mlp --layers 2 --dim 8 --hf " + dir + "/new",
            "has no Hugging Face config"}}) {
    const auto before = snapshot(dir);
    const CommandResult e = run_fsdp_command("export " + c.args);
    EXPECT_EQ(e.code, 1) << c.args << ": " << e.output;
    EXPECT_EQ(std::count(e.output.begin(), e.output.end(), '\n'), 1) << e.output;
    EXPECT_NE(e.output.find(c.expect), std::string::npos) << e.output;
    EXPECT_EQ(snapshot(dir), before) << c.args;
  }
  EXPECT_EQ(tools::parse_shard_size("5GB"), 5000000000ull);
  EXPECT_EQ(tools::parse_shard_size("2GiB"), 2ull << 30);
  EXPECT_EQ(tools::parse_shard_size("1234"), 1234ull);
}

}  // namespace
}  // namespace fsdp::testing
