// Training on token files (fsdp train --data): sharded runs read the same global batches as
// the unsharded reference, the validation loss is reported, and bad data fails at start in one
// line naming the file. The corpus is the one `make run` uses (data/pydocs-4k).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "fsdp/data.h"
#include "runtime/token_file_source.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

const std::string kCorpus = std::string(FSDP_SOURCE_DIR) + "/data/pydocs-4k";

runtime::TrainConfig corpus_config() {
  runtime::TrainConfig c = tiny_transformer_config(/*steps=*/3);
  c.model.ffn_dim = 48;
  c.model.seq_len = 16;
  c.model.vocab = 4096;  // the corpus's tokenizer
  c.tokens = 32;         // two sequences per rank
  c.batch_source = runtime::token_file_batches(kCorpus + "/train.bin", c.model, c.seed);
  return c;
}

class TokenFileParity : public ::testing::TestWithParam<int> {};

// Each rank's slice of each global batch, together, is the reference's whole batch: the same
// losses and params as one rank training on all of it.
TEST_P(TokenFileParity, ShardedRanksMatchTheUnshardedReference) {
  const int world = GetParam();
  const runtime::TrainConfig c = corpus_config();
  const runtime::RankResult ref = run_reference(c, world);
  const auto results = run_fsdp(world, c);
  for (int s = 0; s < c.steps; ++s)
    EXPECT_NEAR(results[0].losses[s], ref.losses[s], 1e-6 * std::abs(ref.losses[s]));
  EXPECT_LE(relative_error(results[0].params, ref.params), 1e-6);
  // Real text at init: the loss starts near ln(vocab).
  EXPECT_NEAR(ref.losses[0], std::log(4096.0), 0.5);
}

INSTANTIATE_TEST_SUITE_P(Worlds, TokenFileParity, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(TrainData, ValidationLossIsReportedBesideTheUnigramEntropy) {
  const std::string json = ::testing::TempDir() + "/train_data.json";
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 2 --model transformer --layers 1 --dim 32 --heads 2 "
      "--seq-len 16 --tokens 32 --steps 4 --eval-every 2 --eval-batches 2 --data " + kCorpus +
      " --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("validation loss after step 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("validation loss after step 4"), std::string::npos) << r.output;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["val_losses"].size(), 2u);
  EXPECT_EQ(j["val_losses"][0]["step"], 2);  // after step 2, as the line counts
  EXPECT_EQ(j["val_losses"][1]["step"], 4);
  const double first = j["val_losses"][0]["loss"];
  EXPECT_GT(first, 0.5 * std::log(4096.0));
  EXPECT_LT(first, 1.5 * std::log(4096.0));
  EXPECT_NEAR(j["unigram_entropy_nats"].get<double>(), 6.4285, 1e-3);
}

// A bad data directory fails before training, in one line naming the file and the problem.
TEST(TrainData, BadDataFailsAtStartInOneLine) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "bad_corpus";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kCorpus + "/meta.json", dir / "meta.json");
  fs::copy_file(kCorpus + "/val.bin", dir / "val.bin");
  const std::string base =
      "train --backend cpu --world-size 1 --model transformer --layers 1 --dim 16 --heads 2 "
      "--seq-len 16 --tokens 32 --steps 2 --data " + dir.string();
  auto expect_one_line = [&](const std::string& args, const std::string& what) {
    const CommandResult r = run_fsdp_command(args);
    EXPECT_NE(r.code, 0) << what;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << what << ": " << r.output;
    EXPECT_NE(r.output.find(what), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(".cpp:"), std::string::npos) << "a user error names no source file: "
                                                         << r.output;
  };
  {  // not a token file
    std::ofstream(dir / "train.bin") << std::string(4096, 'x');
    expect_one_line(base, "train.bin");
  }
  {  // a token at or above the vocabulary
    std::vector<uint16_t> tokens(5000, 7);
    tokens[1234] = 4096;
    data::write_token_file((dir / "train.bin").string(), tokens);
    expect_one_line(base, "train.bin");
  }
  {  // fewer tokens than one batch
    std::vector<uint16_t> tokens(20, 7);
    data::write_token_file((dir / "train.bin").string(), tokens);
    expect_one_line(base, "train.bin");
  }
  expect_one_line("train --backend cpu --model mlp --data " + dir.string(), "--model transformer");
  expect_one_line("train --backend cpu --model transformer --data /nonexistent", "/nonexistent");
  expect_one_line("train --backend cpu --model transformer --eval-every 2", "--eval-every needs --data");
}

}  // namespace
}  // namespace fsdp::testing
