// Note [Hugging Face configs]: config.json files as Hugging Face publishes them (Llama 3.2,
// Llama 3.1, Qwen2.5, Mistral v0.3, in transformers 4's and 5's spellings) set the
// transformer's options; a key nobody reads, or a value the model cannot take, is refused in
// one line naming it. Through the command: --hf-config and --init-from DIR, and one line for
// each bad directory (a bad config.json, a missing shard, an index naming a shard that is not
// there), with nothing written.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "command_util.h"
#include "fsdp/error.h"
#include "io/safetensors.h"
#include "models/hf_config.h"
#include "models/initial_weights.h"
#include "models/model_family.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

using nlohmann::json;

// Llama-3.2-1B's config.json, as published (transformers 4.45).
const json kLlama32 = json::parse(R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");

// Qwen2.5-0.5B's.
const json kQwen25 = json::parse(R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})");

// Mistral-7B-v0.3's.
const json kMistral = json::parse(R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
  "use_cache": true, "vocab_size": 32768})");

std::string config_dir() {
  static const std::string dir = [] {
    const std::string d = ::testing::TempDir() + "hf_config_" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

std::string write_config(const std::string& text, const std::string& name = "config.json") {
  const std::string path = config_dir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

nn::ModelConfig read(const json& j) {
  nn::ModelConfig m;
  models::apply_hf_config(write_config(j.dump()), m);
  return m;
}

// The one-line error of reading `text`.
std::string refusal(const std::string& text) {
  nn::ModelConfig m;
  try {
    models::apply_hf_config(write_config(text), m);
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

TEST(HfConfig, Llama32SetsTheTransformersOptions) {
  const nn::ModelConfig m = read(kLlama32);
  EXPECT_EQ(m.kind, "transformer");
  EXPECT_EQ(m.dim, 2048);
  EXPECT_EQ(m.ffn_dim, 8192);
  EXPECT_EQ(m.layers, 16);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.head_dim, 0);  // 64 = dim / heads: left implicit
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_DOUBLE_EQ(m.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(m.rope_theta, 500000);
  EXPECT_EQ(m.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(m.rope_scaling.factor, 32);
  EXPECT_DOUBLE_EQ(m.rope_scaling.low_freq_factor, 1);
  EXPECT_DOUBLE_EQ(m.rope_scaling.high_freq_factor, 4);
  EXPECT_EQ(m.rope_scaling.original_max_positions, 8192);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_FALSE(m.attention_bias);
  EXPECT_EQ(m.sliding_window, 0);
  nn::ModelConfig r = m;
  r.seq_len = 2048;
  EXPECT_NO_THROW(models::resolved(r));
}

TEST(HfConfig, Qwen25HasBiasesAndNoWindowWhenItIsOff) {
  const nn::ModelConfig m = read(kQwen25);
  EXPECT_EQ(m.dim, 896);
  EXPECT_EQ(m.heads, 14);
  EXPECT_EQ(m.kv_heads, 2);
  EXPECT_TRUE(m.attention_bias);
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_DOUBLE_EQ(m.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(m.rope_theta, 1e6);
  EXPECT_EQ(m.rope_scaling.type, "default");
  EXPECT_EQ(m.sliding_window, 0);  // use_sliding_window false
  json on = kQwen25;
  on["use_sliding_window"] = true;
  on["max_window_layers"] = 0;
  on["sliding_window"] = 16;
  nn::ModelConfig w = read(on);
  EXPECT_EQ(w.sliding_window, 16);
  w.seq_len = 16;
  EXPECT_NO_THROW(models::resolved(w));  // a window as long as the sequences changes nothing
  w.seq_len = 32;
  try {
    models::resolved(w);
    ADD_FAILURE() << "a window shorter than the sequences was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window 16 is shorter than seq_len 32"),
              std::string::npos)
        << e.what();
  }
}

TEST(HfConfig, MistralWithoutAWindowAndTransformers5Spellings) {
  const nn::ModelConfig m = read(kMistral);
  EXPECT_FALSE(m.attention_bias);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(m.sliding_window, 0);
  // transformers 5: rope_parameters instead of rope_theta and rope_scaling, "dtype".
  json v5 = kLlama32;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5.erase("torch_dtype");
  v5["dtype"] = "bfloat16";
  v5["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                           {"factor", 32.0},          {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const nn::ModelConfig a = read(v5), b = read(kLlama32);
  EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling, b.rope_scaling);
  json layers = kMistral;
  layers["layer_types"] = json(std::vector<std::string>(32, "full_attention"));
  layers["sliding_window"] = 4096;
  EXPECT_EQ(read(layers).sliding_window, 0);  // no layer windows
  // A head width of its own.
  json hd = kMistral;
  hd["head_dim"] = 96;
  EXPECT_EQ(read(hd).head_dim, 96);
}

TEST(HfConfig, KeysThatChangeTheModelAreRefusedNamingThem) {
  struct Case {
    json patch;
    std::string expect;
  };
  const std::vector<Case> cases{
      {{{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}},
       "rope_scaling.rope_type is \"yarn\""},
      {{{"hidden_act", "gelu"}}, "hidden_act is \"gelu\""},
      {{{"mlp_bias", true}}, "mlp_bias is true"},
      {{{"attention_dropout", 0.1}}, "attention_dropout is 0.1"},
      {{{"quantization_config", {{"bits", 4}}}}, "the key \"quantization_config\""},
      {{{"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}},
       "has no \"low_freq_factor\""},
      {{{"rope_scaling",
         {{"rope_type", "llama3"},
          {"factor", 8.0},
          {"low_freq_factor", 4.0},
          {"high_freq_factor", 1.0},
          {"original_max_position_embeddings", 8192}}}},
       "high_freq_factor is 1"},
      {{{"rope_scaling", {{"rope_type", "default"}, {"mscale", 1.0}}}}, "the key \"mscale\""},
      {{{"hidden_size", "big"}}, "hidden_size is \"big\", not an integer"},
      {{{"hidden_size", 12.5}}, "hidden_size is 12.5, not an integer"},
      {{{"num_hidden_layers", -3}}, "num_hidden_layers is -3, outside"},
      {{{"vocab_size", 1e300}}, "vocab_size is"},
      {{{"rope_theta", "ten"}}, "rope_theta is \"ten\", not a number"},
      {{{"num_key_value_heads", 64}}, "num_key_value_heads is 64, outside [1, 32]"},
      {{{"model_type", "gpt2"}}, "model_type is \"gpt2\", which no model family reads"},
      {{{"sliding_window", 4096}}, "the key \"sliding_window\""},          // Llama has none
      {{{"attention_bias", true}}, "attention_bias is true; only false"},  // o_proj's too
      {{{"tie_word_embeddings", "yes"}}, "tie_word_embeddings is string"},
      {{{"rope_parameters", {{"rope_theta", 1000.0}}}},
       "rope_theta is 500000, rope_parameters.rope_theta 1000"},
  };
  for (const Case& c : cases) {
    json j = kLlama32;
    for (const auto& [key, value] : c.patch.items()) j[key] = value;  // whole values, not merged
    const std::string message = refusal(j.dump());
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.patch.dump() << ": " << message;
    EXPECT_NE(message.find("config.json"), std::string::npos) << message;
  }
  json missing = kLlama32;
  missing.erase("hidden_size");
  EXPECT_NE(refusal(missing.dump()).find("has no \"hidden_size\""), std::string::npos);
  json qwen = kQwen25;
  qwen["attention_bias"] = false;
  EXPECT_NE(refusal(qwen.dump()).find("attention_bias is false; only true"), std::string::npos);
}

TEST(HfConfig, BadFilesAreRefusedInOneLine) {
  EXPECT_NE(refusal("{\"model_type\": ").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal("[1, 2]").find("not an object"), std::string::npos);
  EXPECT_NE(refusal(std::string(100, '[') + std::string(100, ']')).find("nested deeper"),
            std::string::npos);
  EXPECT_NE(refusal("{}").find("has no \"model_type\""), std::string::npos);
  const std::string big = config_dir() + "/big.json";
  std::ofstream(big) << std::string(models::kMaxHfConfigBytes + 1, ' ');
  nn::ModelConfig m;
  for (const std::string& path : {big, config_dir(), config_dir() + "/absent.json"}) {
    try {
      models::apply_hf_config(path, m);
      ADD_FAILURE() << path;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

// ---- through the command

const std::string kRun = "train --backend cpu --world-size 2 --seq-len 8 --tokens 16 --quiet ";

json tiny_llama() {
  json j = kLlama32;
  j.merge_patch({{"hidden_size", 32},
                 {"intermediate_size", 48},
                 {"num_hidden_layers", 2},
                 {"num_attention_heads", 4},
                 {"num_key_value_heads", 2},
                 {"head_dim", 8},
                 {"vocab_size", 61}});
  return j;
}

// A Hugging Face directory of tiny_llama() with the model's initial weights, over `shards`
// files (1: model.safetensors).
std::string hf_dir(const std::string& name, int shards) {
  const std::string dir = fresh_dir("hf_" + name);
  std::ofstream(dir + "/config.json") << tiny_llama().dump(1);
  nn::ModelConfig m;
  models::apply_hf_config(dir + "/config.json", m);
  m.seq_len = 8;
  const std::string all = dir + (shards == 1 ? "/model.safetensors" : "/all.tmp");
  models::export_initial_weights(m, all, DType::BF16);
  if (shards == 1) return dir;
  const io::SafetensorsFile f(all);
  std::vector<std::vector<char>> bytes;
  json map = json::object();
  bytes.reserve(f.tensors().size());
  for (int s = 0; s < shards; ++s) {
    const std::string file =
        "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
    std::vector<io::TensorToWrite> part;
    for (size_t i = s; i < f.tensors().size(); i += static_cast<size_t>(shards)) {
      const io::TensorEntry& t = f.tensors()[i];
      bytes.emplace_back(t.end - t.begin);
      f.read(t, 0, t.end - t.begin, bytes.back().data());
      part.push_back({t.name, t.dtype, t.shape, bytes.back().data()});
      map[t.name] = file;
    }
    io::write_safetensors(dir + "/" + file, part, {});
  }
  std::filesystem::remove(all);
  std::ofstream(dir + "/model.safetensors.index.json") << json{{"weight_map", map}}.dump(1);
  return dir;
}

TEST(HfConfigCli, HfConfigAndInitFromADirectorySetTheModel) {
  const std::string dir = hf_dir("cli", 1), sharded = hf_dir("cli_sharded", 3);
  const CommandResult a = run_fsdp_command(kRun + "--steps 2 --hf-config " + dir +
                                           "/config.json --json " + dir + "/a.json");
  ASSERT_EQ(a.code, 0) << a.output;
  std::ifstream in(dir + "/a.json");
  EXPECT_EQ(json::parse(in)["model"], "transformer");
  // The same initial weights from one file and from three shards: the same losses.
  const CommandResult b =
      run_fsdp_command(kRun + "--steps 2 --init-from " + dir + " --json " + dir + "/b.json");
  const CommandResult c =
      run_fsdp_command(kRun + "--steps 2 --init-from " + sharded + " --json " + dir + "/c.json");
  ASSERT_EQ(b.code, 0) << b.output;
  ASSERT_EQ(c.code, 0) << c.output;
  std::ifstream ib(dir + "/b.json"), ic(dir + "/c.json");
  EXPECT_EQ(json::parse(ib)["losses"], json::parse(ic)["losses"]);
  const CommandResult flag =
      run_fsdp_command(kRun + "--steps 1 --dim 64 --hf-config " + dir + "/config.json");
  EXPECT_EQ(flag.code, 1);
  EXPECT_NE(flag.output.find("--dim cannot be given with --hf-config"), std::string::npos)
      << flag.output;
}

TEST(HfConfigCli, BadDirectoriesGetOneLineAndNothingIsWritten) {
  struct Case {
    std::string name, expect;
    std::function<void(const std::string& dir)> spoil;
  };
  const std::string shard2 = "model-00002-of-00003.safetensors";
  const std::vector<Case> cases{
      {"bad_config", "not valid JSON",
       [](const std::string& d) {
         std::ofstream(d + "/config.json") << "{\"model_type\": \"llama\",";
       }},
      {"unknown_key", "the key \"flash_attention\"",
       [](const std::string& d) {
         json j = tiny_llama();
         j["flash_attention"] = true;
         std::ofstream(d + "/config.json") << j.dump();
       }},
      {"missing_shard", shard2 + "' named by",
       [&](const std::string& d) { std::filesystem::remove(d + "/" + shard2); }},
      {"index_names_absent_shard", "model-00009-of-00009.safetensors' named by",
       [](const std::string& d) {
         std::ifstream in(d + "/model.safetensors.index.json");
         json j = json::parse(in);
         j["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
         std::ofstream(d + "/model.safetensors.index.json") << j.dump();
       }},
      {"index_outside_its_directory", "not the name of a file in its directory",
       [](const std::string& d) {
         std::ifstream in(d + "/model.safetensors.index.json");
         json j = json::parse(in);
         j["weight_map"]["model.norm.weight"] = "../model.safetensors";
         std::ofstream(d + "/model.safetensors.index.json") << j.dump();
       }},
      {"bad_index", "not valid JSON",
       [](const std::string& d) { std::ofstream(d + "/model.safetensors.index.json") << "{"; }},
      {"unlisted_tensor", "which '",
       [](const std::string& d) {
         std::ifstream in(d + "/model.safetensors.index.json");
         json j = json::parse(in);
         j["weight_map"].erase("model.norm.weight");
         std::ofstream(d + "/model.safetensors.index.json") << j.dump();
       }},
      {"truncated_shard", "truncated",
       [&](const std::string& d) {
         const std::string f = d + "/" + shard2;
         std::filesystem::resize_file(f, std::filesystem::file_size(f) - 3);
       }},
  };
  for (const Case& c : cases) {
    const std::string dir = hf_dir(c.name, 3);
    c.spoil(dir);
    const auto before = snapshot(dir);
    const CommandResult r =
        run_fsdp_command(kRun + "--steps 1 --init-from " + dir + " --save-dir " + dir +
                         "/ckpt --json " + dir + "/s.json");
    EXPECT_EQ(r.code, 1) << c.name << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << c.name << ": " << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.name << ": " << r.output;
    EXPECT_EQ(snapshot(dir), before) << c.name;
  }
}

}  // namespace
}  // namespace fsdp::testing
