// `fsdp simulate` from the command line: the numbers it prints, its trace read back by
// `fsdp report` (whose SVG draws the trace's one simulated rank by default), its JSON, and
// one-line errors for bad input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "command_util.h"

namespace fsdp::testing {
namespace {

const std::string kCalibration = std::string(FSDP_SOURCE_DIR) + "/bench/calibrations/h200.json";

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("fsdp_simulate_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(SimulateCli, PrintsTheStepWritesATraceThatReportDrawsAndJson) {
  const std::string trace = temp_path("trace.json"), svg = temp_path("t.svg"),
                    json = temp_path("s.json");
  const CommandResult r = run_fsdp_command(
      "simulate --model mlp --layers 4 --dim 512 --tokens 1024 --param-dtype bf16 --gpus 16 "
      "--gpus-per-node 8 --calibration " + kCalibration + " --trace " + trace + " --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("one rank is simulated (rank 15) and stands for all 16"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("losses and grad norms: not computed"), std::string::npos);
  EXPECT_NE(r.output.find("exposed communication"), std::string::npos);
  EXPECT_NE(r.output.find("peak memory"), std::string::npos);
  std::ifstream in(json);
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["gpus"], 16);
  EXPECT_GT(s["step"]["step_ms"].get<double>(), 0);
  EXPECT_GT(s["step"]["peak_mem_bytes"].get<int64_t>(), 0);
  // The trace holds rank 15 only; the SVG draws it without --rank.
  const CommandResult report = run_fsdp_command("report " + trace + " --svg " + svg);
  ASSERT_EQ(report.code, 0) << report.output;
  EXPECT_NE(report.output.find("rank 15"), std::string::npos) << report.output;
  EXPECT_NE(report.output.find("wrote " + svg + " (rank 15)"), std::string::npos) << report.output;
  EXPECT_TRUE(std::filesystem::file_size(svg) > 0);
  const CommandResult other = run_fsdp_command("report " + trace + " --svg " + svg + " --rank 3");
  EXPECT_EQ(other.code, 1);
  EXPECT_NE(other.output.find("fsdp: error: --rank 3: the trace holds ranks 15..15"), std::string::npos)
      << other.output;
  for (const std::string& p : {trace, svg, json}) std::filesystem::remove(p);
}

TEST(SimulateCli, BadInputFailsInOneLine) {
  const std::string cal = " --calibration " + kCalibration;
  struct Case { std::string args, message; };
  const Case cases[] = {
      {"--gpus 0" + cal, "fsdp: error: --gpus must be >= 1, got 0\n"},
      {"--gpus 12" + cal, "fsdp: error: --gpus (12) must fill whole nodes of --gpus-per-node (8)\n"},
      {"--calibration /nonexistent.json", "fsdp: error: calibration file '/nonexistent.json' does not exist\n"},
      {"--calibration /", "fsdp: error: calibration file '/' is not a regular file\n"},
      {"--moe-max-load 0.5" + cal, "fsdp: error: --moe-max-load needs --moe-load skewed\n"},
  };
  for (const Case& c : cases) {
    const CommandResult r = run_fsdp_command("simulate " + c.args);
    EXPECT_EQ(r.code, 1) << c.args;
    EXPECT_EQ(r.output, c.message) << c.args;
  }
  const std::string bad = temp_path("bad.json");
  std::ofstream(bad) << "{\"format\": \"fsdp-sim-calibration\", \"version\": 2}";
  const CommandResult r = run_fsdp_command("simulate --calibration " + bad);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.output, "fsdp: error: calibration file '" + bad + "': 'version' must be 1\n");
  std::filesystem::remove(bad);
}

// --fp8 and --fp8-all-gather are train's flags (Note [Simulated fp8]): the run says what it
// models, and the JSON which recipe and all-gather it simulated.
TEST(SimulateCli, Fp8RunsAndSaysWhatItModels) {
  const std::string json = temp_path("fp8.json");
  const std::string args = "simulate --model transformer --param-dtype bf16 --gpus 2 "
                           "--calibration " + kCalibration + " --json " + json + " --fp8 ";
  CommandResult r = run_fsdp_command(args + "tensorwise");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("fp8 tensorwise: the blocks' GEMMs at 0.509 x their bf16 time (the "
                          "calibration's gemm.fp8), casts and transposes as memory-bound passes; "
                          "float8 all-gather\n"),
            std::string::npos) << r.output;
  nlohmann::json s = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(s["fp8"], "tensorwise");
  EXPECT_EQ(s["fp8_all_gather"], true);
  r = run_fsdp_command(args + "tensorwise --fp8-all-gather 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("; bf16 all-gather\n"), std::string::npos) << r.output;
  s = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(s["fp8_all_gather"], false);
  r = run_fsdp_command(args + "rowwise");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("fp8 rowwise: the blocks' GEMMs at 0.497 x"), std::string::npos)
      << r.output;
  std::filesystem::remove(json);
}

// What train refuses with --fp8, simulate refuses in the same line (the same checks); and,
// as train --backend cuda does, sizes that cuBLASLt's fp8 GEMMs cannot take, and a
// calibration without an fp8 rate.
TEST(SimulateCli, Fp8RefusalsAreTrainsInOneLine) {
  const std::string cal = " --calibration " + kCalibration;
  const std::string same_as_train[] = {
      "--model transformer --param-dtype fp32 --fp8 tensorwise",
      "--model mlp --param-dtype bf16 --fp8 tensorwise",
      "--model transformer --param-dtype bf16 --fp8 tensorwise --optimizer-in-forward 1",
      "--model transformer --param-dtype bf16 --fp8 tensorwise --reshard-after-forward 2",
      "--model transformer --param-dtype bf16 --fp8 bogus",
  };
  for (const std::string& a : same_as_train) {
    const CommandResult train = run_fsdp_command("train --backend cpu --world-size 2 " + a);
    const CommandResult sim = run_fsdp_command("simulate --gpus 2 " + a + cal);
    EXPECT_NE(sim.code, 0) << a;
    EXPECT_EQ(sim.code, train.code) << a;
    EXPECT_EQ(sim.output, train.output) << a;
    EXPECT_EQ(std::count(sim.output.begin(), sim.output.end(), '\n'), 1) << sim.output;
    EXPECT_EQ(sim.output.rfind("fsdp: error: --fp8", 0), 0u) << sim.output;
  }
  EXPECT_EQ(run_fsdp_command("simulate --gpus 2 --model transformer --param-dtype fp32 --fp8 "
                             "tensorwise" + cal).output,
            "fsdp: error: --fp8 needs --param-dtype bf16 (its GEMMs take and give bf16), got "
            "fp32\n");
  EXPECT_EQ(run_fsdp_command("simulate --model transformer --param-dtype bf16 --fp8 rowwise "
                             "--tokens 24 --seq-len 8" + cal).output,
            "fsdp: error: --fp8 on CUDA needs the tokens per micro-batch (24) to be a multiple "
            "of 16 (cuBLASLt's fp8 GEMMs)\n");
  const std::string bare = temp_path("no_fp8.json");
  nlohmann::json j = nlohmann::json::parse(std::ifstream(kCalibration));
  j["gemm"].erase("fp8");
  std::ofstream(bare) << j.dump();
  const CommandResult r = run_fsdp_command(
      "simulate --model transformer --param-dtype bf16 --fp8 tensorwise --calibration " + bare);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.output, "fsdp: error: --fp8 tensorwise cannot be simulated with calibration '" +
                          bare + "': it has no fp8 GEMM rate (gemm.fp8.tensorwise)\n");
  std::filesystem::remove(bare);
}

}  // namespace
}  // namespace fsdp::testing
