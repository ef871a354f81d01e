// Text generation (src/generate, Note [KV cache] in fsdp/device.h): the KV-cache ops against the
// training ops, greedy decoding with the cache against the whole sequence recomputed for every
// token, seeded sampling, and the one-line refusals of the library and of `fsdp generate`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/sim/sim_backend.h"
#include "checkpoint/full_weights.h"
#include "checkpoint/sharded_state.h"
#include "command_util.h"
#include "cpu_test_util.h"
#include "fsdp/error.h"
#include "fsdp/nn/transformer.h"
#include "generate/generator.h"
#include "models/model_family.h"
#include "tokenizer/tokenizer.h"

namespace fsdp {
namespace {

using cpu::cpu_test::DeviceTest;
using cpu::cpu_test::download;
using cpu::cpu_test::values;

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "generate_tests/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// ---- the device ops: a token's rotation and attention row, bit for bit those of the training
// ops over the whole sequence.

class KvCacheOps : public DeviceTest {};

TEST_F(KvCacheOps, RopeAtAndCachedAttentionAreTheWholeSequencesBitForBit) {
  const int64_t seq = 11, heads = 4, kv_heads = 2, hd = 8, prompt = 6;
  const int64_t qw = heads * hd, kvw = kv_heads * hd, ld = qw + 2 * kvw;
  const std::vector<float> inv_freq = nn::rope_inv_freq(hd, 500000.0, {});
  for (DType t : {DType::F32, DType::BF16}) {
    // The whole sequence, as the training forward runs it.
    void* qkv = put(values(seq * ld, 1.5f, 1), t);
    dev->rope(s, qkv, ld, t, seq, heads, hd, seq, inv_freq.data(), false);
    dev->rope(s, static_cast<char*>(qkv) + qw * dtype_size(t), ld, t, seq, kv_heads, hd, seq,
              inv_freq.data(), false);
    auto col = [&](void* base, int64_t row, int64_t c) {
      return static_cast<char*>(base) + (row * ld + c) * dtype_size(t);
    };
    void* out = fresh(seq * qw, t);
    float* lse = static_cast<float*>(fresh(heads * seq));
    dev->attention_forward(s, qkv, ld, col(qkv, 0, qw), ld, col(qkv, 0, qw + kvw), ld, t, 1, seq,
                           heads, kv_heads, hd, out, qw, lse);
    // The same tokens through the cache: the prompt at once, then one token at a time.
    void* qkv2 = put(values(seq * ld, 1.5f, 1), t);
    void* k_cache = fresh(seq * kvw, t);
    void* v_cache = fresh(seq * kvw, t);
    void* out2 = fresh(seq * qw, t);
    for (int64_t at = 0; at < seq; at += at == 0 ? prompt : 1) {
      const int64_t rows = at == 0 ? prompt : 1;
      dev->rope_at(s, col(qkv2, at, 0), ld, t, rows, heads, hd, at, inv_freq.data());
      dev->rope_at(s, col(qkv2, at, qw), ld, t, rows, kv_heads, hd, at, inv_freq.data());
      dev->attention_kv_cache(s, col(qkv2, at, 0), ld, col(qkv2, at, qw), ld,
                              col(qkv2, at, qw + kvw), ld, t, rows, at, seq, heads, kv_heads, hd,
                              k_cache, v_cache,
                              static_cast<char*>(out2) + at * qw * dtype_size(t), qw);
    }
    EXPECT_EQ(download(*dev, s, qkv2, seq * ld, t), download(*dev, s, qkv, seq * ld, t));
    EXPECT_EQ(download(*dev, s, out2, seq * qw, t), download(*dev, s, out, seq * qw, t));
  }
}

TEST_F(KvCacheOps, RowsPastTheCacheAreRefused) {
  void* q = fresh(64), *cache = fresh(4 * 16), *out = fresh(64);
  EXPECT_THROW(dev->attention_kv_cache(s, q, 32, q, 16, q, 16, DType::F32, 2, 3, 4, 4, 2, 8,
                                       cache, cache, out, 32),
               Error);
  EXPECT_THROW(dev->attention_kv_cache(s, q, 32, q, 16, q, 16, DType::F32, 1, 0, 4, 3, 2, 8,
                                       cache, cache, out, 32),
               Error);  // heads not a multiple of kv_heads
}

// The simulation backend costs a decode step as the memory it moves: the whole cache read.
TEST(KvCacheSim, AStepCostsTheCacheItReads) {
  sim::SimOptions o;
  o.calibration = sim::ideal_calibration(1000, 100, 100);
  o.cost_log = true;
  sim::SimWorld world(o);
  std::unique_ptr<Device> dev = world.make_device();
  const Stream s = dev->create_stream("s", StreamPriority::Normal);
  const int64_t heads = 8, kv_heads = 2, hd = 64, kvw = kv_heads * hd, capacity = 1000;
  void* p = dev->alloc(64 << 20, s, MemTag::Other);  // simulated memory: an address only
  const std::vector<float> freqs = nn::rope_inv_freq(hd, 10000.0, {});
  dev->rope_at(s, p, heads * hd, DType::BF16, 1, heads, hd, 999, freqs.data());
  dev->attention_kv_cache(s, p, heads * hd, p, kvw, p, kvw, DType::BF16, 1, 999, capacity, heads,
                          kv_heads, hd, p, p, p, heads * hd);
  dev->free(p, s);
  dev->synchronize();
  double bytes = -1;
  for (const auto& [key, cost] : world.cost_log())
    if (key.second == "attention_kv_cache") bytes = cost.bytes;
  EXPECT_EQ(bytes, (4.0 * kvw + 2.0 * capacity * kvw + 2.0 * heads * hd) * 2);
}

// ---- the model: Qwen2-style biases, a tied head, GQA and llama3 rope scaling, with weights
// large enough that attention is far from uniform (random init's 0.02 would hide rope errors).

nn::ModelConfig small_decoder() {
  nn::ModelConfig m;
  m.kind = "transformer";
  m.layers = 2;
  m.dim = 64;
  m.heads = 4;
  m.kv_heads = 2;  // head_dim 16
  m.ffn_dim = 96;
  m.vocab = 101;
  m.seq_len = 32;
  m.rope_theta = 500000.0;
  // Wavelengths 2 pi theta^(2i/16): 6.3 (kept: below 64 / 4), 32 (between: interpolated) and
  // the rest above 64 (divided by the factor).
  m.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
  m.tie_embeddings = true;
  m.attention_bias = true;
  m.norm_eps = 1e-6;
  return m;
}

// Writes weights of `m` to a safetensors file under the family's Hugging Face names.
std::string write_weights(const nn::ModelConfig& m, const std::string& dir) {
  std::unique_ptr<nn::Model> model = models::build_model(m);
  std::vector<std::vector<float>> data;
  std::vector<checkpoint::FullTensor> tensors;
  int salt = 0;
  model->visit([&](Module& mod) {
    for (const auto& p : mod.params()) {
      const bool norm = p->name() == "weight" && p->shape().size() == 1;
      const float scale = norm ? 0.2f : p->name() == "bias" ? 0.5f : 1.2f / std::sqrt(static_cast<float>(p->cols()));
      std::vector<float> v = values(p->numel(), scale, ++salt);
      if (norm)
        for (float& x : v) x += 1.0f;
      data.push_back(std::move(v));
    }
  });
  size_t i = 0;
  model->visit([&](Module& mod) {
    for (const auto& p : mod.params())
      tensors.push_back({checkpoint::param_fqn(mod, *p), p->shape(), data[i++].data()});
  });
  const std::string path = dir + "/model.safetensors";
  checkpoint::write_full_weights(path, tensors, DType::F32,
                                 models::family(m.kind).hf_names(models::resolved(m)));
  return path;
}

class Generate : public ::testing::Test {
 protected:
  cpu::CpuWorld world{1, {}};
  std::unique_ptr<Device> dev = world.make_device(0);
};

TEST_F(Generate, GreedyWithTheCacheIsTheWholeSequenceRecomputed) {
  const nn::ModelConfig m = small_decoder();
  const std::string weights = write_weights(m, fresh_dir("greedy"));
  generate::DecoderModel model(*dev, m, DType::F32, weights);
  const std::vector<int32_t> prompt{3, 17, 99, 42, 5, 64};
  generate::GenerateOptions o;
  o.max_new_tokens = 16;
  o.keep_logits = true;
  const generate::Generation cached = model.generate(prompt, o);
  o.kv_cache = false;
  const generate::Generation whole = model.generate(prompt, o);
  ASSERT_EQ(cached.tokens.size(), 16u);
  EXPECT_EQ(cached.tokens, whole.tokens);
  // Not one token repeated throughout: the weights make the model's choice depend on the text.
  EXPECT_GT(std::set<int32_t>(cached.tokens.begin(), cached.tokens.end()).size(), 3u);
  // The logits: the same ops but for the GEMMs' row blocking (BLAS may sum a one-row product
  // in another order), so equal to within fp32 rounding of the head's sums.
  ASSERT_EQ(cached.logits.size(), whole.logits.size());
  for (size_t step = 0; step < cached.logits.size(); ++step)
    for (size_t v = 0; v < cached.logits[step].size(); ++v)
      ASSERT_NEAR(cached.logits[step][v], whole.logits[step][v],
                  2e-5f * std::max(1.0f, std::fabs(whole.logits[step][v])))
          << "step " << step << ", token " << v;
}

TEST_F(Generate, SamplingIsAFunctionOfTheSeed) {
  const nn::ModelConfig m = small_decoder();
  generate::DecoderModel model(*dev, m, DType::F32, write_weights(m, fresh_dir("sampling")));
  const std::vector<int32_t> prompt{7, 8, 9};
  generate::GenerateOptions o;
  o.max_new_tokens = 12;
  o.sampling = {1.3, 0.95, 11};
  const std::vector<int32_t> a = model.generate(prompt, o).tokens;
  EXPECT_EQ(model.generate(prompt, o).tokens, a);
  o.kv_cache = false;
  EXPECT_EQ(model.generate(prompt, o).tokens, a);  // the same logits, the same draws
  o.kv_cache = true;
  o.sampling.seed = 12;
  EXPECT_NE(model.generate(prompt, o).tokens, a);
  o.sampling.top_p = 1e-9;  // the nucleus is the most likely token alone: greedy
  const std::vector<int32_t> nucleus = model.generate(prompt, o).tokens;
  o.sampling = {};
  EXPECT_EQ(model.generate(prompt, o).tokens, nucleus);
}

TEST_F(Generate, EndOfSequenceStopsIt) {
  const nn::ModelConfig m = small_decoder();
  generate::DecoderModel model(*dev, m, DType::F32, write_weights(m, fresh_dir("eos")));
  const std::vector<int32_t> prompt{1, 2, 3};
  generate::GenerateOptions o;
  o.max_new_tokens = 10;
  const std::vector<int32_t> all = model.generate(prompt, o).tokens;
  o.eos_id = all[2];
  const generate::Generation stopped = model.generate(prompt, o);
  EXPECT_TRUE(stopped.stopped_at_eos);
  const size_t first = static_cast<size_t>(std::find(all.begin(), all.end(), all[2]) - all.begin());
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(all.begin(), all.begin() + first + 1));
}

TEST(Sampling, GreedyTopPAndTheDrawsFrequencies) {
  generate::SamplingOptions greedy;
  EXPECT_EQ(generate::next_token(std::vector<float>{1, 3, 3, 2}, greedy, 0), 1);  // first max
  // p = (1/4, 3/4) at temperature 1: the draws follow it.
  const std::vector<float> logits{0.0f, std::log(3.0f)};
  generate::SamplingOptions o{1.0, 1.0, 5};
  int ones = 0;
  for (int step = 0; step < 4000; ++step) ones += generate::next_token(logits, o, step);
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
  o.top_p = 0.7;  // 3/4 alone reaches it
  for (int step = 0; step < 50; ++step) EXPECT_EQ(generate::next_token(logits, o, step), 1);
  EXPECT_THROW(generate::next_token(std::vector<float>{0, NAN}, greedy, 0), UserError);
}

// ---- refusals: one line each.

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(Generate, BadOptionsAreOneLineEach) {
  const nn::ModelConfig m = models::resolved(small_decoder());
  const std::vector<int32_t> prompt{1, 2};
  auto check = [&](generate::GenerateOptions o, std::vector<int32_t> p = {1, 2}) {
    return message_of([&] { generate::check_generation(m, 32, p, o); });
  };
  generate::GenerateOptions o;
  o.max_new_tokens = 30;
  EXPECT_EQ(check(o), "no error");
  EXPECT_NE(check(o, {}).find("prompt is empty"), std::string::npos);
  o.max_new_tokens = 31;
  EXPECT_NE(check(o).find("more than the model's 32 positions"), std::string::npos);
  o.max_new_tokens = 0;
  EXPECT_NE(check(o).find("max_new_tokens must be >= 1"), std::string::npos);
  o.max_new_tokens = 4;
  o.sampling.temperature = -0.5;
  EXPECT_NE(check(o).find("temperature must be a number >= 0"), std::string::npos);
  o.sampling = {1.0, 0.0, 0};
  EXPECT_NE(check(o).find("top_p must be in (0, 1]"), std::string::npos);
  o.sampling.top_p = 1.5;
  EXPECT_NE(check(o).find("top_p must be in (0, 1]"), std::string::npos);
  o.sampling = {};
  EXPECT_NE(check(o, {1, 101}).find("outside the model's vocabulary of 101"), std::string::npos);
  nn::ModelConfig mlp;
  mlp.kind = "mlp";
  EXPECT_NE(message_of([&] { generate::DecoderModel(*dev, mlp, DType::F32, ""); })
                .find("not a language model"),
            std::string::npos);
}

// ---- the command: a Hugging Face directory (config.json, weights, tokenizer.json).

std::string hf_model_dir(const std::string& name) {
  const std::string dir = fresh_dir(name);
  nn::ModelConfig m = small_decoder();
  m.vocab = 704;  // the fixture tokenizer's 663 ids fit
  write_weights(m, dir);
  nlohmann::json config = models::family(m.kind).hf_config(models::resolved(m), DType::F32);
  config["max_position_embeddings"] = 48;
  std::ofstream(dir + "/config.json") << config.dump();
  const std::string fixture = std::string(FSDP_SOURCE_DIR) + "/tests/fixtures/tokenizer/llama3_like/";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(fixture + f, dir + "/" + f);
  return dir;
}

// `fsdp ARGS` exits 1 with one line holding `words`.
void expect_one_line_error(const std::string& args, const std::string& words) {
  const testing::CommandResult r = testing::run_fsdp_command(args);
  EXPECT_EQ(r.code, 1) << args << ": " << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find(words), std::string::npos) << args << ": " << r.output;
}

TEST(GenerateCommand, TextFromAModelDirectoryWithAndWithoutTheCache) {
  if (!tokenizer::reads_tokenizer_json()) GTEST_SKIP() << "this build reads no tokenizer.json";
  const std::string dir = hf_model_dir("command");
  const std::string base = "generate --backend cpu --init-from " + dir +
                           " --prompt 'The quick brown fox' --max-new-tokens 12 --ignore-eos";
  const testing::CommandResult cached = testing::run_fsdp_command(base + " --json " + dir + "/a.json");
  ASSERT_EQ(cached.code, 0) << cached.output;
  EXPECT_EQ(cached.output.rfind("The quick brown fox", 0), 0u) << cached.output;
  const testing::CommandResult whole =
      testing::run_fsdp_command(base + " --no-kv-cache --json " + dir + "/b.json");
  ASSERT_EQ(whole.code, 0) << whole.output;
  const nlohmann::json a = nlohmann::json::parse(std::ifstream(dir + "/a.json"));
  const nlohmann::json b = nlohmann::json::parse(std::ifstream(dir + "/b.json"));
  EXPECT_EQ(a["new_ids"].size(), 12u);
  EXPECT_EQ(a["new_ids"], b["new_ids"]);
  EXPECT_EQ(a["prompt_ids"][0], 659);  // <|begin_of_text|>, as Hugging Face's tokenizer(text)
  EXPECT_EQ(cached.output, whole.output);
}

TEST(GenerateCommand, BadInputIsOneLine) {
  if (!tokenizer::reads_tokenizer_json()) GTEST_SKIP() << "this build reads no tokenizer.json";
  const std::string dir = hf_model_dir("command_errors");
  const std::string base = "generate --backend cpu --init-from " + dir;
  expect_one_line_error(base + " --prompt ''", "give the --prompt (text) or the --input-ids");
  expect_one_line_error(base + " --prompt hi --temperature -1", "--temperature must be a number >= 0");
  expect_one_line_error(base + " --prompt hi --top-p 0", "--top-p must be in (0, 1]");
  expect_one_line_error(base + " --prompt hi --top-p 1.01", "--top-p must be in (0, 1]");
  expect_one_line_error(base + " --prompt hi --max-new-tokens 48", "more than the model's 48 positions");
  const testing::CommandResult missing = testing::run_fsdp_command(
      "generate --init-from " + dir + "/nothing-here --prompt hi");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("/nothing-here' does not exist"), std::string::npos)
      << missing.output;
  // No tokenizer: the weights file alone, with its config.json named.
  const testing::CommandResult r = testing::run_fsdp_command(
      "generate --backend cpu --init-from " + dir + "/model.safetensors --hf-config " + dir +
      "/config.json --prompt hi");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("generate needs the model's tokenizer"), std::string::npos) << r.output;
}

// The prompt as ids: no tokenizer is read (a build without a tokenizer.json reader generates
// all the same), the new tokens print as ids, and they are the text prompt's.
TEST(GenerateCommand, InputIdsAreThePromptWithoutATokenizer) {
  const std::string dir = hf_model_dir("command_ids");
  const std::string base = "generate --backend cpu --init-from " + dir + " --max-new-tokens 12";
  const testing::CommandResult ids = testing::run_fsdp_command(
      base + " --input-ids 659,84,104,101,32,113 --json " + dir + "/ids.json");
  ASSERT_EQ(ids.code, 0) << ids.output;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/ids.json"));
  EXPECT_EQ(j["prompt_ids"], nlohmann::json({659, 84, 104, 101, 32, 113}));
  ASSERT_EQ(j["new_ids"].size(), 12u);  // no tokenizer, no end-of-sequence token
  std::string printed;
  for (const auto& id : j["new_ids"]) printed += (printed.empty() ? "" : " ") + std::to_string(id.get<int>());
  EXPECT_EQ(ids.output, printed + "\n");
  if (tokenizer::reads_tokenizer_json()) {
    const testing::CommandResult text = testing::run_fsdp_command(
        base + " --ignore-eos --prompt 'The quick brown fox' --json " + dir + "/text.json");
    ASSERT_EQ(text.code, 0) << text.output;
    const nlohmann::json t = nlohmann::json::parse(std::ifstream(dir + "/text.json"));
    std::string joined;
    for (const auto& id : t["prompt_ids"]) joined += (joined.empty() ? "" : ",") + std::to_string(id.get<int>());
    const testing::CommandResult same =
        testing::run_fsdp_command(base + " --input-ids " + joined + " --json " + dir + "/same.json");
    ASSERT_EQ(same.code, 0) << same.output;
    EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir + "/same.json"))["new_ids"], t["new_ids"]);
  }
  expect_one_line_error(base + " --input-ids 1,,2", "--input-ids: '' (item 2) is not a token id in [0, 704)");
  expect_one_line_error(base + " --input-ids 704", "'704' (item 1) is not a token id in [0, 704)");
  expect_one_line_error(base + " --input-ids -1", "'-1' (item 1) is not a token id");
  expect_one_line_error(base + " --input-ids 3x", "'3x' (item 1) is not a token id");
  expect_one_line_error(base + " --input-ids 1,", "'' (item 2) is not a token id");
  expect_one_line_error(base + " --input-ids 99999999999999999999", "is not a token id");
  expect_one_line_error(base + " ", "give the --prompt (text) or the --input-ids");
  const testing::CommandResult both = testing::run_fsdp_command(base + " --prompt hi --input-ids 1");
  EXPECT_EQ(both.code, 2) << both.output;  // a usage error, as every flag CLI11 refuses
  EXPECT_NE(both.output.find("--prompt excludes --input-ids"), std::string::npos) << both.output;
}

}  // namespace
}  // namespace fsdp
