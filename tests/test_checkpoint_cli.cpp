// The command with checkpoints: a real crash (the process exits mid-save) leaves the previous
// checkpoint loadable and a resume finishes the run as if uninterrupted; every bad input gets
// a one-line error naming the file and the problem, a non-zero exit, and changes nothing.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <functional>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace {

const std::string kRun = "train --backend cpu --world-size 2 --model mlp --tokens 4 ";
const std::string kShape = "--layers 2 --dim 16 ";
const std::string kModel = kRun + kShape;

// Runs the command with one environment variable set (for FSDP_TEST_CRASH_AT).
CommandResult run_with_env(const std::string& env, const std::string& args) {
  const std::string cmd = "env " + env + " " + FSDP_BINARY + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::vector<float> losses_of(const std::string& json_path) {
  std::ifstream in(json_path);
  return nlohmann::json::parse(in)["losses"].get<std::vector<float>>();
}

TEST(CheckpointCli, ACrashMidSaveLeavesThePreviousCheckpointAndResumeFinishesTheRun) {
  const std::string base = fresh_dir("cli_uninterrupted");
  CommandResult full = run_fsdp_command(kModel + "--steps 4 --quiet --json " + base + "/run.json");
  ASSERT_EQ(full.code, 0) << full.output;
  const std::vector<float> expected = losses_of(base + "/run.json");
  for (const std::string crash : {"fsync:step-000004/rank-00001.safetensors",
                                  "rank-file-written:step-000004/rank-00000.safetensors",
                                  "rename:step-000004/COMPLETE"}) {
    SCOPED_TRACE(crash);
    const std::string dir = fresh_dir("cli_crash_" + std::to_string(crash.size()));
    const std::string save = "--save-dir " + dir + " --save-every 2 --quiet ";
    CommandResult crashed = run_with_env("FSDP_TEST_CRASH_AT=" + crash, kModel + "--steps 4 " + save);
    EXPECT_EQ(crashed.code, 86) << crashed.output;  // the test hook's _exit: a real crash
    EXPECT_TRUE(std::filesystem::exists(dir + "/step-000002/COMPLETE"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/step-000004/COMPLETE"));
    CommandResult resumed = run_fsdp_command(kModel + "--steps 4 " + save + "--resume " + dir +
                                             " --json " + dir + "/run.json");
    ASSERT_EQ(resumed.code, 0) << resumed.output;
    const std::vector<float> rest = losses_of(dir + "/run.json");
    ASSERT_EQ(rest.size(), 2u);
    EXPECT_EQ(rest[0], expected[2]);
    EXPECT_EQ(rest[1], expected[3]);
    EXPECT_TRUE(std::filesystem::exists(dir + "/step-000004/COMPLETE"));
  }
}

// A checkpoint of kModel at steps 1 and 2, made once.
const std::string& base_checkpoint() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("cli_base");
    CommandResult r = run_fsdp_command(kModel + "--steps 2 --save-every 1 --quiet --save-dir " + d);
    EXPECT_EQ(r.code, 0) << r.output;
    return d;
  }();
  return dir;
}

void flip_byte(const std::string& path, int64_t offset_from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-offset_from_end, std::ios::end);
  const char c = static_cast<char>(f.get() ^ 0x5a);
  f.seekp(-offset_from_end, std::ios::end);
  f.put(c);
}

void replace_in_file(const std::string& path, const std::string& from, const std::string& to) {
  std::string s = read_file(path);
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << s;
}

struct BadInput {
  std::string name;
  std::function<void(const std::string& save_dir)> damage;
  std::string resume;  // relative to the copy: "" is the save dir itself
  std::string extra_flags;  // the model's shape flags, when not kShape
  std::string expect;  // in the message
  std::string names;   // the file the message must name
};

TEST(CheckpointCli, EveryBadCheckpointGetsAOneLineErrorAndChangesNothing) {
  const std::string s2 = "step-000002/";
  const std::vector<BadInput> cases = {
      {"truncated", [&](const std::string& d) {
         const std::string p = d + "/" + s2 + "rank-00001.safetensors";
         std::filesystem::resize_file(p, std::filesystem::file_size(p) - 100);
       }, "", "", "truncated", "rank-00001.safetensors"},
      {"corrupt_data", [&](const std::string& d) { flip_byte(d + "/" + s2 + "rank-00000.safetensors", 10); },
       "", "", "checksum mismatch", "rank-00000.safetensors"},
      {"corrupt_header", [&](const std::string& d) {
         replace_in_file(d + "/" + s2 + "rank-00001.safetensors", "\"format\":\"pt\"", "\"format\":\"px\"");
       }, "", "", "header checksum mismatch", "rank-00001.safetensors"},
      {"missing_rank_file", [&](const std::string& d) {
         std::filesystem::remove(d + "/" + s2 + "rank-00001.safetensors");
       }, "", "", "is missing", "rank-00001.safetensors"},
      {"incomplete", [&](const std::string& d) { std::filesystem::remove(d + "/" + s2 + "COMPLETE"); },
       s2, "", "incomplete checkpoint", "step-000002"},
      {"none_complete", [&](const std::string& d) {
         std::filesystem::remove(d + "/" + s2 + "COMPLETE");
         std::filesystem::remove(d + "/step-000001/COMPLETE");
       }, "", "", "holds no complete checkpoint", "cli_bad_none_complete"},
      {"corrupt_index", [&](const std::string& d) { flip_byte(d + "/" + s2 + "index.json", 30); },
       "", "", "checksum mismatch", "index.json"},
      {"corrupt_marker", [&](const std::string& d) {
         replace_in_file(d + "/" + s2 + "COMPLETE", "\"step\": 2", "\"step\": 3");
       }, "", "", "corrupt", "COMPLETE"},
      {"other_shape", nullptr, "", "--layers 2 --dim 24", "another model shape", "step-000002"},
      {"other_layers", nullptr, "", "--layers 3 --dim 16", "another model shape", "step-000002"},
      {"dtype_mismatch", nullptr, "", "--param-dtype bf16", "dtype mismatch", "step-000002"},
      {"other_optimizer", nullptr, "", "--optimizer sgd", "holds adamw state", "step-000002"},
      {"not_a_checkpoint", [](const std::string& d) { std::filesystem::create_directories(d + "/empty"); },
       "empty", "", "is not a checkpoint", "empty"},
      {"does_not_exist", nullptr, "nowhere", "", "does not exist", "nowhere"},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = fresh_dir("cli_bad_" + c.name);
    std::filesystem::copy(base_checkpoint(), dir, std::filesystem::copy_options::recursive);
    if (c.damage) c.damage(dir);
    const auto before = snapshot(dir);
    const std::string resume = c.resume.empty() ? dir : dir + "/" + c.resume;
    const std::string flags = c.extra_flags.find("--dim") == std::string::npos ? kShape + c.extra_flags : c.extra_flags;
    CommandResult r = run_fsdp_command(kRun + flags + " --steps 5 --resume " + resume);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.names), std::string::npos) << r.output;
    EXPECT_EQ(snapshot(dir), before) << "nothing on disk may change";
  }
}

// A tmpfs mounted for one test (root only; the test says so and skips otherwise).
class Tmpfs {
 public:
  Tmpfs(const std::string& dir, const std::string& options, unsigned long flags = 0) : dir_(dir) {
    std::filesystem::create_directories(dir);
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", flags, options.c_str()) == 0;
  }
  ~Tmpfs() {
    if (mounted_) ::umount(dir_.c_str());
  }
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

TEST(CheckpointCli, ASaveDirThatIsNotWritableIsRefusedBeforeTraining) {
  const std::string dir = fresh_dir("cli_read_only") + "/mnt";
  Tmpfs ro(dir, "size=1m", MS_RDONLY);
  if (!ro.mounted()) {
    std::filesystem::create_directories(dir);
    std::filesystem::permissions(dir, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    if (::geteuid() == 0) GTEST_SKIP() << "needs root to mount a read-only tmpfs, or a non-root user for chmod";
  }
  CommandResult r = run_fsdp_command(kModel + "--steps 2 --save-dir " + dir);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "no step ran:\n" << r.output;
  EXPECT_NE(r.output.find("save dir '" + dir + "' is not writable"), std::string::npos) << r.output;
}

TEST(CheckpointCli, AFullDiskIsRefusedBeforeTrainingAndAFullDiskMidSaveKeepsThePrevious) {
  const std::string dir = fresh_dir("cli_full") + "/mnt";
  {
    Tmpfs small(dir, "size=64k");
    if (!small.mounted()) GTEST_SKIP() << "needs root to mount a tmpfs (the write-budget test covers ENOSPC)";
    // 4 x 64 x 64 weights, AdamW: 192 KiB a checkpoint.
    CommandResult r = run_fsdp_command(kRun + "--layers 4 --dim 64 --steps 2 --save-dir " + dir);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << "no step ran:\n" << r.output;
    EXPECT_NE(r.output.find("save dir '" + dir + "' has 0 MiB free"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("(disk full)"), std::string::npos) << r.output;
  }
  {
    // Room for one checkpoint (~100 KiB) but not two: the second save hits ENOSPC.
    Tmpfs room_for_one(dir, "size=160k");
    ASSERT_TRUE(room_for_one.mounted());
    CommandResult r = run_fsdp_command(kRun + "--layers 2 --dim 64 --steps 4 --save-every 2 --quiet --save-dir " + dir);
    EXPECT_EQ(r.code, 1) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_TRUE(r.output.find("No space left on device") != std::string::npos ||
                r.output.find("failed to write its shard file") != std::string::npos)
        << r.output;
    EXPECT_TRUE(std::filesystem::exists(dir + "/step-000002/COMPLETE"));
    EXPECT_FALSE(std::filesystem::exists(dir + "/step-000004/COMPLETE"));
    const std::string out = fresh_dir("cli_full_export") + "/model.safetensors";
    CommandResult e = run_fsdp_command("export --checkpoint " + dir + " --out " + out);
    EXPECT_EQ(e.code, 0) << "the previous checkpoint loads: " << e.output;
  }
}

}  // namespace
}  // namespace fsdp::testing
