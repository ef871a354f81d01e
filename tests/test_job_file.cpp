// `fsdp train --config job.toml` (Note [Job files]): the file's keys are the flags, the command
// line wins, and nothing in a file is ignored: an unknown key, a section, a value the flag
// refuses or a file that is no regular file ends in one line before anything trains.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

const std::string kFlags =
    "--backend cpu --world-size 2 --model transformer --layers 2 --dim 32 --heads 4 --kv-heads 2 "
    "--ffn-dim 40 --seq-len 8 --vocab 61 --tokens 16 --steps 3 --rope-theta 500000 "
    "--tie-embeddings --quiet";
const std::string kJob =
    "backend = \"cpu\"\nworld-size = 2\nmodel = \"transformer\"\nlayers = 2\ndim = 32\n"
    "heads = 4\nkv_heads = 2\nffn-dim = 40\nseq-len = 8\nvocab = 61\ntokens = 16\nsteps = 3\n"
    "rope-theta = 500000.0\ntie-embeddings = true\nquiet = true\n";

std::string write(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << text;
  return path;
}

nlohmann::json summary_of(const std::string& args, const std::string& json) {
  const CommandResult r = run_fsdp_command("train " + args + " --json " + json);
  EXPECT_EQ(r.code, 0) << r.output;
  std::ifstream in(json);
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
}

TEST(JobFile, TrainsAsTheSameFlagsOnTheCommandLineAndTheCommandLineWins) {
  const std::string dir = fresh_dir("job_file");
  const std::string job = write(dir, "job.toml", kJob);
  const nlohmann::json flags = summary_of(kFlags, dir + "/flags.json");
  const nlohmann::json file = summary_of("--config " + job, dir + "/file.json");
  ASSERT_EQ(flags["losses"].size(), 3u);
  EXPECT_EQ(file["losses"], flags["losses"]);
  // A flag given beside the file keeps its value: 2 steps, not the file's 3, and the
  // untied model (its first loss differs from the tied one's).
  const nlohmann::json over =
      summary_of("--config " + job + " --steps 2 --tie-embeddings=false", dir + "/over.json");
  EXPECT_EQ(over["losses"].size(), 2u);
  EXPECT_NE(over["losses"][0], flags["losses"][0]);
}

TEST(JobFile, WhatAFileHoldsIsNeverIgnored) {
  const std::string dir = fresh_dir("job_file_bad");
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      {kJob + "layerz = 3\n", "'layerz' is not a flag of `fsdp train`"},
      {"[train]\nlayers = 3\n", "sections ([train]) are not read"},
      {"layers = \"two\"\n", "layers: Could not convert"},
      {"layers = [1, 2]\n", "layers: --layers: At Most 1"},
      {"model = \"gpt\"\n", "model: --model: gpt not in"},
      {"quiet = 3\n", "'quiet' is a flag: give it true or false"},
      {"config = \"other.toml\"\n", "'config' is not a flag"},
      {std::string(2 << 20, '#'), "job file"},  // over 1 MiB
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string job = write(dir, "bad" + std::to_string(i) + ".toml", cases[i].text);
    const std::string json = dir + "/bad" + std::to_string(i) + ".json";
    const CommandResult r = run_fsdp_command("train --config " + job + " --json " + json);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find(cases[i].expect), std::string::npos) << cases[i].expect << ": " << r.output;
    EXPECT_FALSE(std::filesystem::exists(json)) << "nothing ran";
  }
  for (const std::string& path : {std::string("/dev/zero"), dir, dir + "/missing.toml"}) {
    const CommandResult r = run_fsdp_command("train --config " + path);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_NE(r.output.find("--config: cannot "), std::string::npos) << r.output;
  }
}

// Every committed example is a job file the command reads whole: each with the sizes cut on
// the command line, one step.
TEST(JobFile, TheCommittedExamplesRead) {
  const std::string tiny =
      " --backend cpu --world-size 2 --layers 2 --dim 64 --heads 4 --kv-heads 2 --head-dim 16 "
      "--ffn-dim 40 --vocab 97 --seq-len 8 --tokens 16 --steps 1 --warmup-steps 0 --quiet";
  int seen = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(FSDP_SOURCE_DIR) +
                                                           "/examples/jobs")) {
    if (e.path().extension() != ".toml") continue;
    ++seen;
    const CommandResult r = run_fsdp_command("train --config " + e.path().string() + tiny);
    EXPECT_EQ(r.code, 0) << e.path() << ": " << r.output;
  }
  EXPECT_GE(seen, 3);
}

}  // namespace
}  // namespace fsdp::testing
