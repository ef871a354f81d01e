// The Hugging Face dialects of the transformer against values computed apart from the engine:
// tests/fixtures/make_hf_dialects.py (numpy, float64, the published formulas) gives RoPE's
// frequencies with theta and Llama 3.1's scaling, and for tiny Llama-3-, Qwen2- and
// Mistral-like models (tied head, q/k/v biases, a head width that is not dim / heads, rope
// theta, llama3 scaling) the first loss, the gradient's norm and the loss after an SGD step.
// The models come from the fixture's own config.json and safetensors file (a Hugging Face
// directory, one file or shards), as `--init-from DIR` reads them.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fixture_tokens.h"
#include "fsdp/nn/transformer.h"
#include "golden_fixture.h"
#include "io/safetensors.h"
#include "models/hf_config.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

using nlohmann::json;

const json& fixture() {
  static const json j = golden_fixture("golden_hf_dialects.json");
  return j;
}

const json& model_case(const std::string& name) {
  for (const json& m : fixture().at("models"))
    if (m.at("name") == name) return m;
  ADD_FAILURE() << "no model " << name << " in the fixture";
  return fixture().at("models").at(0);
}

TEST(RopeFrequencies, ThetaAndLlama3ScalingMatchThePublishedFormulas) {
  for (const json& c : fixture().at("rope")) {
    nn::RopeScaling s;
    if (!c.at("scaling").is_null()) {
      const json& j = c.at("scaling");
      s.type = "llama3";
      s.factor = j.at("factor").get<double>();
      s.low_freq_factor = j.at("low_freq_factor").get<double>();
      s.high_freq_factor = j.at("high_freq_factor").get<double>();
      s.original_max_positions = j.at("original_max_position_embeddings").get<int64_t>();
    }
    const int64_t hd = c.at("head_dim").get<int64_t>();
    const std::vector<float> got = nn::rope_inv_freq(hd, c.at("theta").get<double>(), s);
    expect_close(got, c.at("inv_freq").get<std::vector<double>>(), 1e-6, 0,
                 c.at("name").get<std::string>());
    if (s.type == "llama3") {  // the scaling changed some of them: the case tests something
      EXPECT_NE(got, nn::rope_inv_freq(hd, c.at("theta").get<double>(), {})) << c.at("name");
    }
  }
}

// The fixture model's weights by its rule, under their Hugging Face names.
struct Weights {
  std::vector<std::vector<float>> values;
  std::vector<io::TensorToWrite> tensors;
};

Weights weights_of(const json& m) {
  Weights w;
  const json& specs = m.at("weights");
  w.values.reserve(specs.size());
  for (const json& s : specs) {
    const auto shape = s.at("shape").get<std::vector<int64_t>>();
    int64_t n = 1;
    for (int64_t v : shape) n *= v;
    w.values.push_back(golden_rule_values(s.at("salt").get<uint64_t>(), n,
                                          s.at("scale").get<double>(),
                                          s.at("offset").get<double>()));
    w.tensors.push_back({s.at("name").get<std::string>(), "F32", shape, w.values.back().data()});
  }
  return w;
}

std::string fresh_model_dir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "hf_dialects_" + std::to_string(::getpid()) + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A Hugging Face directory of the fixture's model: its config.json, and its weights in one
// model.safetensors, or (shards > 1) split over that many files with an index.
std::string model_dir(const json& m, int shards) {
  const std::string dir =
      fresh_model_dir(m.at("name").get<std::string>() + "_" + std::to_string(shards));
  write_text(dir + "/config.json", m.at("config").dump(1));
  const Weights w = weights_of(m);
  if (shards == 1) {
    io::write_safetensors(dir + "/model.safetensors", w.tensors, {{"format", "pt"}});
    return dir;
  }
  json map = json::object();
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<io::TensorToWrite> part;
    for (size_t i = s; i < w.tensors.size(); i += static_cast<size_t>(shards)) {
      part.push_back(w.tensors[i]);
      map[w.tensors[i].name] = name;
    }
    io::write_safetensors(dir + "/" + name, part, {{"format", "pt"}});
  }
  write_text(dir + "/model.safetensors.index.json",
             json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(1));
  return dir;
}

// Two SGD steps of the fixture's model from `dir` on its batches (no momentum, decay or
// clipping, a constant lr), its config from the directory's config.json.
runtime::TrainConfig dialect_config(const json& m, const std::string& dir, int world) {
  runtime::TrainConfig c;
  models::apply_hf_config(dir + "/config.json", c.model);
  c.model.seq_len = m.at("model").at("seq_len").get<int64_t>();
  c.tokens = fixture().at("train").at("sequences").get<int64_t>() * c.model.seq_len / world;
  c.steps = 2;
  c.optimizer.kind = "sgd";
  c.optimizer.sgd_lr = fixture().at("train").at("sgd_lr").get<float>();
  c.optimizer.sgd_momentum = 0;
  c.optimizer.sgd_weight_decay = 0;
  c.optimizer.max_grad_norm = 0;
  c.schedule.kind = "constant";
  c.schedule.total_steps = c.steps;
  const json batches = m.at("batches");
  c.batch_source = [batches](int, int) { return std::make_unique<FixtureTokens>(batches); };
  c.checkpoint.init_from = dir;
  return c;
}

// fp32 against float64 (as tests/test_golden_transformer.cpp).
constexpr double kRel = 1e-5;

void expect_numpys_run(const std::string& name, int world, int shards) {
  const json& m = model_case(name);
  const std::string dir = model_dir(m, shards);
  const runtime::TrainConfig c = dialect_config(m, dir, world);
  const auto results = run_fsdp(world, c);
  const std::string who =
      name + " on " + std::to_string(world) + " ranks, " + std::to_string(shards) + " shard(s)";
  expect_close(results[0].losses, m.at("losses").get<std::vector<double>>(), kRel, 0,
               who + " loss");
  ASSERT_FALSE(results[0].grad_norms.empty()) << who;
  expect_close({results[0].grad_norms[0]}, {m.at("grad_norm").get<double>()}, kRel, 0,
               who + " grad norm");
}

TEST(HfDialects, Llama3TiedWithScaledRopeAndItsOwnHeadWidthMatchesNumpy) {
  const nn::ModelConfig m = [] {
    nn::ModelConfig c;
    models::apply_hf_config(model_dir(model_case("llama3"), 1) + "/config.json", c);
    return c;
  }();
  EXPECT_TRUE(m.tie_embeddings);
  EXPECT_EQ(m.rope_scaling.type, "llama3");
  EXPECT_EQ(m.head_dim, 8);  // not dim / heads = 4
  expect_numpys_run("llama3", 1, 1);
  expect_numpys_run("llama3", 2, 1);
}

TEST(HfDialects, Qwen2TiedWithBiasesMatchesNumpy) {
  expect_numpys_run("qwen2", 1, 1);
  expect_numpys_run("qwen2", 2, 3);
}

TEST(HfDialects, MistralRopeThetaMatchesNumpy) {
  expect_numpys_run("mistral", 2, 1);
}

// Each rank reads its rows of each tensor from the shard that holds it, not the whole file.
TEST(HfDialects, ShardedDirectoryLoadsTheSameModelAndEachRankReadsItsRows) {
  const json& m = model_case("qwen2");
  const std::string one = model_dir(m, 1), four = model_dir(m, 4);
  const auto a = run_fsdp(2, dialect_config(m, one, 2));
  const auto b = run_fsdp(2, dialect_config(m, four, 2));
  EXPECT_EQ(a[0].losses, b[0].losses);
  EXPECT_EQ(a[0].grad_norms, b[0].grad_norms);

  uint64_t data = 0, headers = 0;
  for (const auto& e : std::filesystem::directory_iterator(four))
    if (e.path().extension() == ".safetensors") {
      const io::SafetensorsFile f(e.path().string());
      headers += f.header_bytes();
      data += f.file_bytes() - f.header_bytes();
    }
  runtime::TrainConfig c = dialect_config(m, four, 2);
  c.steps = 1;
  std::vector<uint64_t> read(2, 0);
  runtime::run_cpu_ranks(2, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    const uint64_t before = io::thread_bytes_read();
    runtime::train_rank(device, comm, c);
    read[static_cast<size_t>(rank)] = io::thread_bytes_read() - before;
  });
  // About half the rows of each tensor each (an odd row count rounds up on rank 0), and each
  // header at most once per rank. (The ranks share one parse only while both hold the file,
  // Note [Shared readers]; a rank that finishes loading before the other starts lets it go, so
  // how often the headers are parsed in all depends on timing and is tested with a held reader
  // in test_safetensors.cpp.)
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(read[r], data * 3 / 8) << "rank " << r;
    EXPECT_LT(read[r], headers + data * 5 / 8)
        << "rank " << r << " read " << read[r] << " of " << data << " + " << headers;
  }
}

}  // namespace
}  // namespace fsdp::testing
