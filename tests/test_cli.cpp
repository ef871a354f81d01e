// The fsdp command: a whole training run, and bad input giving one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "command_util.h"

namespace {

using fsdp::testing::CommandResult;
using fsdp::testing::run_fsdp_command;

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(Cli, MoeOnFourRanksBoundsTheRingAndLearns) {
  const std::string json = ::testing::TempDir() + "cli_summary.json";
  CommandResult r = run_fsdp_command("train --backend cpu --world-size 4 --model moe --steps 30 "
              "--rs-max-input-buffers 2 --separate-rs-group 1 --quiet --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  nlohmann::json s = read_json(json);
  EXPECT_EQ(s["backend"], "cpu");
  EXPECT_EQ(s["world_size"], 4);
  EXPECT_EQ(s["rs_max_input_buffers"], 2);
  EXPECT_EQ(s["rs_inputs_in_flight_max"], 2);  // measured by the allocator
  EXPECT_LT(s["loss_last"].get<double>(), s["loss_first"].get<double>());
  for (const char* key : {"step_ms_median", "tokens_per_s", "peak_mem_bytes", "separate_rs_group",
                          "model", "steps", "lrs", "grad_norms", "clip_grad_norm"})
    EXPECT_TRUE(s.contains(key)) << key;
  // Throughput against a GPU's peak means nothing on the CPU.
  EXPECT_FALSE(s.contains("tflops_per_gpu"));
  EXPECT_FALSE(s.contains("mfu"));
  // Clipping is on by default, so the optimizer runs after backward.
  EXPECT_EQ(s["optimizer_in_backward"], false);
}

// Every input the command must refuse: a non-zero exit and one line naming the problem,
// with no source location (Note [Errors]: those are for internal errors only).
TEST(Cli, EveryBadInputGivesOneLineAndNonZeroExit) {
  for (const char* args :
       {"train --backend cpu --rs-max-input-buffers 0", "train --backend cpu --world-size 0",
        "train --no-such-flag", "train --backend cpu --model gpt5", "frobnicate",
        "train --backend cpu --model transformer --kv-heads 3",
        "train --backend cpu --model transformer --seq-len 48",
        "train --backend cpu --reshard-after-forward 3", "train --backend cpu --separate-rs-group yes",
        "train --backend cpu --lr -1", "train --backend cpu --lr 0", "train --backend cpu --chaos -5",
        "train --backend cpu --classes -3", "train --backend cpu --nproc 0",
        "train --backend cpu --nproc 2 --world-size 2",
        "train --backend cpu --world-size 100000", "train --backend cpu --dim 100000",
        "train --backend cpu --steps 0", "train --backend cpu --tokens 0",
        "train --backend cpu --warmup 5 --steps 5", "train --backend cpu --min-lr 1",
        "train --backend cpu --warmup-steps -2", "train --backend cpu --clip-grad-norm -1",
        "train --backend cpu --optimizer-in-backward 1", "train --backend cpu --log-every 0",
        "train --backend cpu --lr-schedule step", "train --backend cpu --json /nonexistent/dir/x.json",
        "train --backend cpu --trace /", "train --backend cpu --experts 0",
        "train --backend cpu --reduce-dtype fp16",
        // multi-node launch and rendezvous
        "train --backend cpu --timeout 0", "train --backend cpu --timeout -5",
        "train --backend cpu --timeout soon", "train --backend cpu --nnodes 0",
        "train --backend cpu --node-rank -1", "train --backend cpu --master-port 70000",
        "train --backend cpu --master-port 0", "train --backend cpu --nnodes 2 --node-rank 1",
        "train --backend cpu --master-addr 10.0.0.1"}) {
    CommandResult r = run_fsdp_command(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.code, -1) << args << ": crashed";
    EXPECT_EQ(lines(r.output), 1) << args << ":\n" << r.output;
    EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(".cpp:"), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(r.output.find("internal"), std::string::npos) << args << ": " << r.output;
  }
}

TEST(Cli, UnknownCommandIsNamedAsUnknown) {
  CommandResult r = run_fsdp_command("frobnicate");
  EXPECT_NE(r.output.find("unknown command 'frobnicate'"), std::string::npos) << r.output;
}

TEST(Cli, VersionNamesTheCommitAndTheCudaBuild) {
  CommandResult r = run_fsdp_command("--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(lines(r.output), 1) << r.output;
  EXPECT_NE(r.output.find("fsdp "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("commit "), std::string::npos) << r.output;
  EXPECT_TRUE(r.output.find("CUDA ") != std::string::npos ||
              r.output.find("without CUDA") != std::string::npos) << r.output;
}

// Every option with a value shows its default: CLI11's "=value", or "[default: ...]" where it
// depends on other options.
TEST(Cli, HelpShowsEveryDefault) {
  CommandResult r = run_fsdp_command("train --help");
  EXPECT_EQ(r.code, 0);
  std::istringstream in(r.output);
  std::string line;
  int options = 0;
  for (std::string pending; std::getline(in, line);) {
    if (line.rfind("  --", 0) == 0) pending = line;
    else if (!pending.empty()) pending += line;
    else continue;
    if (pending.find("  ", 4) == std::string::npos && line.rfind("  --", 0) == 0) continue;
    const std::string name = pending.substr(2, pending.find_first_of(" ", 2) - 2);
    ++options;
    if (name == "--json" || name == "--trace" || name == "--quiet" || name == "--chaos" ||
        name == "--data" || name == "--save-dir" || name == "--resume" || name == "--init-from") {
      pending.clear();
      continue;  // no default: off unless given
    }
    // CLI11 shows a default as "=VALUE" (2.1) or " [VALUE]" (newer); ours say "[default: ...]".
    EXPECT_TRUE(pending.find('=') != std::string::npos ||
                pending.find(" [") != std::string::npos) << pending;
    pending.clear();
  }
  EXPECT_GT(options, 30);
}

TEST(Cli, AutoBackendSaysWhichItChoseAndWhy) {
  CommandResult r = run_fsdp_command("train --backend auto --steps 1 --quiet");
  if (r.output.find("backend: cuda") != std::string::npos) GTEST_SKIP() << "a GPU machine";
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("backend: cpu (--backend auto: "), std::string::npos) << r.output;
}

TEST(Cli, AFailedSummaryWriteIsAnError) {
  CommandResult r = run_fsdp_command("train --backend cpu --steps 2 --quiet --json /dev/full");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--json: cannot write '/dev/full': No space left on device"), std::string::npos)
      << r.output;
}

TEST(Cli, StepLinesEveryNStepsAndNoneWhenQuiet) {
  CommandResult r = run_fsdp_command("train --backend cpu --steps 7 --log-every 3");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* step : {"step 1/7 ", "step 3/7 ", "step 6/7 ", "step 7/7 "})
    EXPECT_NE(r.output.find(step), std::string::npos) << step << "\n" << r.output;
  for (const char* step : {"step 2/7 ", "step 4/7 ", "step 5/7 "})
    EXPECT_EQ(r.output.find(step), std::string::npos) << step << "\n" << r.output;
  for (const char* field : {"loss ", "lr ", "grad_norm ", "tokens/s ", "eta "})
    EXPECT_NE(r.output.find(field), std::string::npos) << field;
  EXPECT_EQ(r.output.find("mfu"), std::string::npos) << "MFU is for GPUs";
  CommandResult quiet = run_fsdp_command("train --backend cpu --steps 3 --quiet");
  ASSERT_EQ(quiet.code, 0);
  EXPECT_EQ(quiet.output.find("step 1/3"), std::string::npos) << quiet.output;
}

// --reduce-dtype (FSDP2's MixedPrecisionPolicy.reduce_dtype) reaches the reduce-scatters: the
// first loss comes before any reduction and is the same; the gradients averaged in bf16 then
// differ from fp32's by rounding, so later losses differ, a little.
TEST(Cli, ReduceDtypeChangesTheGradientReduction) {
  auto run = [](const std::string& dtype) {
    const std::string json = ::testing::TempDir() + "cli_reduce_" + dtype + ".json";
    CommandResult r = run_fsdp_command("train --backend cpu --world-size 2 --steps 6 --quiet "
                                       "--reduce-dtype " + dtype + " --json " + json);
    EXPECT_EQ(r.code, 0) << r.output;
    return r.code == 0 ? read_json(json) : nlohmann::json::object();
  };
  const nlohmann::json fp32 = run("fp32"), bf16 = run("bf16");
  ASSERT_TRUE(fp32.contains("losses") && bf16.contains("losses"));
  EXPECT_EQ(fp32["reduce_dtype"], "fp32");
  EXPECT_EQ(bf16["reduce_dtype"], "bf16");
  const auto a = fp32["losses"].get<std::vector<float>>(), b = bf16["losses"].get<std::vector<float>>();
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_NE(a.back(), b.back()) << "the bf16 reduction was not used";
  EXPECT_NEAR(a.back(), b.back(), 1e-2 * std::abs(a.back()));
}

}  // namespace
