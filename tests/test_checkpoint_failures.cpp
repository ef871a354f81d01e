// A save that fails or crashes at any stage leaves the previous checkpoint the latest loadable
// one (Note [Checkpoint save stages]); --keep-last prunes only complete checkpoints.
#include <gtest/gtest.h>

#include <cctype>

#include "checkpoint/checkpoint_format.h"
#include "fsdp/error.h"
#include "io/file_io.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig four_steps(const std::string& dir) {
  runtime::TrainConfig c = small_config("mlp");
  c.steps = 4;
  c.checkpoint.save_dir = dir;
  c.checkpoint.save_every = 2;
  c.checkpoint.keep_last = 1;
  return c;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct Stage {
  std::string stage, path_suffix;
  bool new_checkpoint_complete;  // the failure came after COMPLETE was written
};

const std::vector<Stage> kStages = {
    {"begin", "step-000004", false},
    {"write", "step-000004/rank-00001.safetensors", false},
    {"fsync", "step-000004/rank-00000.safetensors", false},
    {"rename", "step-000004/rank-00001.safetensors", false},
    {"rank-file-written", "step-000004/rank-00000.safetensors", false},
    {"write", "step-000004/index.json", false},
    {"rename", "step-000004/index.json", false},
    {"all-ranks-written", "step-000004", false},
    {"write", "step-000004/COMPLETE", false},
    {"fsync", "step-000004/COMPLETE", false},
    {"rename", "step-000004/COMPLETE", false},
    {"complete-written", "step-000004", true},
    {"prune", "step-000002", true},
};

class FailureAt : public ::testing::TestWithParam<int> {};

TEST_P(FailureAt, LeavesThePreviousCheckpointLoadable) {
  const Stage& s = kStages[GetParam()];
  SCOPED_TRACE(s.stage + " " + s.path_suffix);
  runtime::TrainConfig plain = small_config("mlp");
  plain.steps = 4;
  const auto uninterrupted = run_fsdp(2, plain);
  const std::string dir = fresh_dir("fail_" + std::to_string(GetParam()) + "_" + s.stage);
  io::set_fault_hook_for_testing([s](const std::string& stage, const std::string& path) {
    if (stage == s.stage && ends_with(path, s.path_suffix)) FSDP_FAIL("injected failure");
  });
  EXPECT_THROW(run_fsdp(2, four_steps(dir)), Error);
  io::set_fault_hook_for_testing(nullptr);
  const std::string latest = checkpoint::resolve_checkpoint_dir(dir);
  EXPECT_TRUE(ends_with(latest, s.new_checkpoint_complete ? "step-000004" : "step-000002"))
      << latest;
  EXPECT_NO_THROW(checkpoint::open_checkpoint(latest));
  EXPECT_TRUE(io::path_exists(dir + "/step-000002/COMPLETE")) << "the previous one is intact";
  if (s.new_checkpoint_complete) return;
  // Resume into the same save dir: the debris of step 4 is replaced by a complete save.
  runtime::TrainConfig again = four_steps(dir);
  again.checkpoint.resume = dir;
  const auto rest = run_fsdp(2, again);
  EXPECT_EQ(rest[0].params, uninterrupted[0].params);
  EXPECT_TRUE(io::path_exists(dir + "/step-000004/COMPLETE"));
  EXPECT_FALSE(io::path_exists(dir + "/step-000002")) << "--keep-last 1";
}

INSTANTIATE_TEST_SUITE_P(Stages, FailureAt, ::testing::Range(0, static_cast<int>(kStages.size())),
                         [](const auto& info) {
                           std::string name = kStages[info.param].stage + "_" +
                                              kStages[info.param].path_suffix;
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST(CheckpointFailure, ADiskFullDuringASaveFailsTheRunAndKeepsThePreviousCheckpoint) {
  const std::string dir = fresh_dir("disk_full_hook");
  io::set_fault_hook_for_testing([](const std::string& stage, const std::string& path) {
    // The disk fills up once step 2 is complete: rank 0's own writes for step 4 fail.
    if (stage == "complete-written" && ends_with(path, "step-000002"))
      io::set_write_budget_for_testing(100);
  });
  std::string error;
  try {
    run_fsdp(2, four_steps(dir));
  } catch (const Error& e) {
    error = e.what();
  }
  io::set_fault_hook_for_testing(nullptr);
  io::set_write_budget_for_testing(-1);
  EXPECT_TRUE(error.find("No space left on device") != std::string::npos ||
              error.find("failed to write its shard file") != std::string::npos)
      << error;
  EXPECT_TRUE(ends_with(checkpoint::resolve_checkpoint_dir(dir), "step-000002"));
  EXPECT_NO_THROW(checkpoint::open_checkpoint(dir + "/step-000002"));
}

TEST(CheckpointKeepLast, PrunesOnlyCompleteCheckpointsOlderThanTheNewestN) {
  const std::string dir = fresh_dir("keep_last");
  // An incomplete step directory that this run does not write (step 1; it saves 2, 4, 6).
  std::filesystem::create_directories(dir + "/step-000001");
  std::ofstream(dir + "/step-000001/rank-00000.safetensors") << "partial";
  runtime::TrainConfig c = small_config("mlp");
  c.checkpoint.save_dir = dir;
  c.checkpoint.save_every = 2;
  c.checkpoint.keep_last = 2;
  run_fsdp(2, c);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-000001", "step-000004", "step-000006"}));
  EXPECT_EQ(read_file(dir + "/step-000001/rank-00000.safetensors"), "partial");
}

}  // namespace
}  // namespace fsdp::testing
