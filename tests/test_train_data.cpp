// Training on token files (fsdp train --data): sharded runs read the same global batches as
// the unsharded reference, the validation loss is reported, and bad data fails at start in one
// line naming the file. The corpus is the one `make run` uses (data/pydocs-4k).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "fsdp/data.h"
#include "fsdp/error.h"
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

// A copy of the corpus's first `tokens` training tokens, with its meta.json and val.bin.
std::filesystem::path corpus_copy(const std::string& name, int64_t tokens) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ifstream in(kCorpus + "/train.bin", std::ios::binary);
  std::string bytes(static_cast<size_t>(data::kTokenFileHeaderBytes + 2 * tokens), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const int32_t count = static_cast<int32_t>(tokens);
  std::memcpy(bytes.data() + 8, &count, 4);  // the header's token count
  std::ofstream(dir / "train.bin", std::ios::binary) << bytes;
  fs::copy_file(kCorpus + "/meta.json", dir / "meta.json");
  fs::copy_file(kCorpus + "/val.bin", dir / "val.bin");
  return dir;
}

// Note [Unreadable steps]: the file shrinks after step 2; reading step 3's batch is an error
// naming the step and the file (once a SIGBUS from the mapping: no message, no summary).
TEST(TrainData, ATokenFileTruncatedWhileTrainingStopsTheRunAtThatStep) {
  const std::string path = (corpus_copy("truncated_in_process", 4000) / "train.bin").string();
  runtime::TrainConfig c = corpus_config();
  c.steps = 5;
  c.batch_source = runtime::token_file_batches(path, c.model, c.seed);
  c.after_step = [&](runtime::TrainState& s) {
    if (s.next_step == 2) std::filesystem::resize_file(path, 1024);  // the header alone
  };
  try {
    run_fsdp(1, c);
    ADD_FAILURE() << "the run went on";
  } catch (const UserError& e) {
    const std::string m = e.what();
    const auto* step = dynamic_cast<const runtime::StepError*>(&e);
    EXPECT_TRUE(step && step->step() == 2) << m;
    EXPECT_EQ(m.rfind("step 3: cannot read '" + path + "' at byte ", 0), 0u) << m;
    EXPECT_NE(m.find("it holds 1024 bytes now, 9024 when it was opened"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

// The same for a file of the uint32 layout (Llama 3's): its windows are 4-byte tokens.
TEST(TrainData, AUint32TokenFileTruncatedWhileTrainingStopsTheRunAtThatStep) {
  const std::filesystem::path dir = corpus_copy("truncated_uint32", 4000);
  const std::string path = (dir / "train.bin").string();
  {
    const data::TokenFile narrow(path, 65536);
    data::write_token_file(path, narrow.read_all(), data::TokenDtype::kUint32);
  }
  runtime::TrainConfig c = corpus_config();
  c.steps = 5;
  c.batch_source = runtime::token_file_batches(path, c.model, c.seed);
  c.after_step = [&](runtime::TrainState& s) {
    if (s.next_step == 2) std::filesystem::resize_file(path, 1024 + 4 * 100);
  };
  try {
    run_fsdp(1, c);  // one rank: no other rank's host may still be reading an earlier step
    ADD_FAILURE() << "the run went on";
  } catch (const UserError& e) {
    const std::string m = e.what();
    const auto* step = dynamic_cast<const runtime::StepError*>(&e);
    EXPECT_TRUE(step && step->step() == 2) << m;
    EXPECT_EQ(m.rfind("step 3: cannot read '" + path + "' at byte ", 0), 0u) << m;
    EXPECT_NE(m.find("it holds 1424 bytes now, 17024 when it was opened"), std::string::npos) << m;
  }
}

// The command: one line naming the file and the step, exit 1, and the JSON summary of the
// steps before it. The file is cut while the run goes (after its first step line); it fails at
// whichever step reads next, on whichever rank.
TEST(TrainData, ATokenFileTruncatedWhileTrainingEndsInOneLineWithTheSummaryWritten) {
  const std::filesystem::path dir = corpus_copy("truncated_cli", 20000);
  const std::string json = (dir / "run.json").string(), train = (dir / "train.bin").string();
  const std::string cmd = "timeout -k 5 120 " + std::string(FSDP_BINARY) +
                          " train --backend cpu --world-size 2 --model transformer --layers 1 --dim 16"
                          " --heads 2 --seq-len 16 --tokens 32 --steps 1000000 --eval-every 0"
                          " --log-every 1 --data " + dir.string() + " --json " + json + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::vector<std::string> lines;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) {
    lines.emplace_back(buf);
    if (lines.back().rfind("step ", 0) == 0 && std::filesystem::file_size(train) > 1024)
      std::filesystem::resize_file(train, 1024);
  }
  const int status = pclose(pipe);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal: " << (lines.empty() ? "" : lines.back());
  EXPECT_EQ(WEXITSTATUS(status), 1) << (lines.empty() ? "" : lines.back());
  ASSERT_FALSE(lines.empty());
  const std::string& last = lines.back();
  EXPECT_EQ(last.rfind("fsdp: error: step ", 0), 0u) << last;
  EXPECT_NE(last.find("cannot read '" + train + "'"), std::string::npos) << last;
  std::ifstream in(json);
  ASSERT_TRUE(in.good()) << "no summary written";
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_NE(j["error"].get<std::string>().find(train), std::string::npos) << j["error"];
  const int failed = j["failed_step"].get<int>();
  EXPECT_GE(failed, 2);
  EXPECT_EQ(j["error"].get<std::string>().rfind("step " + std::to_string(failed) + ": ", 0), 0u) << j["error"];
  EXPECT_GE(j["steps_done"].get<int>(), 1);
  EXPECT_EQ(j["losses"].size(), j["steps_done"].get<size_t>());
  EXPECT_TRUE(j["peak_mem_bytes"].is_null()) << j["peak_mem_bytes"];  // unknown, not 0
}

}  // namespace
}  // namespace fsdp::testing
