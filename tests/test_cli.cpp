// The fsdp command: the done-when run, and bad input giving one-line errors.
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

TEST(Cli, MoeOnFourRanksBoundsTheRingAndLearns) {
  const std::string json = ::testing::TempDir() + "cli_summary.json";
  CommandResult r = run_fsdp_command("train --backend cpu --world-size 4 --model moe --steps 30 "
              "--rs-max-input-buffers 2 --separate-rs-group 1 --quiet --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(json);
  nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["backend"], "cpu");
  EXPECT_EQ(s["world_size"], 4);
  EXPECT_EQ(s["rs_max_input_buffers"], 2);
  EXPECT_EQ(s["rs_inputs_in_flight_max"], 2);  // measured by the allocator
  EXPECT_LT(s["loss_last"].get<double>(), s["loss_first"].get<double>());
  for (const char* key : {"step_ms_median", "tokens_per_s", "peak_mem_bytes", "separate_rs_group", "model", "steps"})
    EXPECT_TRUE(s.contains(key)) << key;
}

TEST(Cli, BadInputGivesOneLineAndNonZeroExit) {
  for (const char* args : {"train --backend cpu --rs-max-input-buffers 0",
                           "train --backend cpu --world-size 0", "train --no-such-flag",
                           "train --backend cpu --model gpt5", "frobnicate"}) {
    CommandResult r = run_fsdp_command(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.code, -1) << args << ": crashed";
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ":\n" << r.output;
    EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
  }
}

}  // namespace
