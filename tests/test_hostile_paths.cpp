// Paths that name something other than a regular file. Written: a FIFO or a device is written
// through and never replaced, a symlink to a regular file is refused (Note [Output paths]).
// Read: a FIFO, a device or an oversized metadata file is refused in one line before any read,
// never waited on (Note [Reading files]). Every command runs under `timeout`, so a hang is a
// failure with exit code 124, not a stuck suite.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <thread>

#include "command_util.h"
#include "crafted_checkpoint.h"
#include "fsdp/data.h"
#include "io/safetensors.h"
#include "test_checkpoint_util.h"

namespace fsdp::testing {
namespace fs = std::filesystem;
namespace {

const std::string kInit = "export --init --model mlp --layers 2 --dim 16 --out ";
const std::string kTrain =
    "train --backend cpu --world-size 2 --model mlp --layers 2 --dim 16 --tokens 4 ";

CommandResult run_bounded(const std::string& args) {
  return run_fsdp_command_prefixed("timeout -k 5 30 ", args);
}

void expect_one_line_error(const CommandResult& r, const std::vector<std::string>& expect) {
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  for (const std::string& e : expect)
    EXPECT_NE(r.output.find(e), std::string::npos) << e << ": " << r.output;
}

bool is_kind(const std::string& path, mode_t kind) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && (st.st_mode & S_IFMT) == kind;
}

// Reads a FIFO to its end on a thread. It is opened (non-blocking) before any writer, so a
// writer's open finds a reader; poll() then waits for the writer's bytes, and reports a hang-up
// only once a writer has come and gone (Linux's FIFO semantics).
class FifoReader {
 public:
  // `hang_up_after_one`: take one byte, then close (the writer's next write meets no reader).
  explicit FifoReader(std::string path, bool hang_up_after_one = false) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    thread_ = std::thread([this, hang_up_after_one] {
      char buf[1 << 16];
      for (;;) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 120'000) <= 0) return;  // only when the test has failed already
        const ssize_t n = ::read(fd_, buf, hang_up_after_one ? 1 : sizeof buf);
        if (n > 0) bytes_ += static_cast<uint64_t>(n);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
        if (hang_up_after_one && n > 0) {
          ::close(fd_);
          fd_ = -1;
          return;
        }
      }
    });
  }
  // After the command: a writer that never came is stood in for, so the thread ends.
  uint64_t finish() {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) ::close(fd);
    thread_.join();
    if (fd_ >= 0) ::close(fd_);
    return bytes_;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::atomic<uint64_t> bytes_{0};
  std::thread thread_;
};

TEST(HostilePaths, AFifoGivenAsOutputIsWrittenThroughOrRefusedNeverReplaced) {
  const std::string dir = fresh_dir("paths_fifo_out");
  const std::string fifo = dir + "/out.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  // No process reads it: refused at once (a blocking open would wait forever).
  expect_one_line_error(run_bounded(kInit + fifo), {fifo, "FIFO that no process reads"});
  EXPECT_TRUE(is_kind(fifo, S_IFIFO)) << "the FIFO is still a FIFO";
  // A reader: the file goes through it, byte for byte what a regular file gets.
  ASSERT_EQ(run_bounded(kInit + dir + "/regular.safetensors").code, 0);
  FifoReader reader(fifo);
  const CommandResult r = run_bounded(kInit + fifo);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(reader.finish(), fs::file_size(dir + "/regular.safetensors"));
  EXPECT_TRUE(is_kind(fifo, S_IFIFO));
  // A reader that goes away mid-file: the write's EPIPE is the error (not a SIGPIPE that ends
  // the process with no message). 256 x 256 weights are more than a pipe's 64 KiB buffer.
  FifoReader quitter(fifo, /*hang_up_after_one=*/true);
  expect_one_line_error(run_bounded("export --init --model mlp --layers 2 --dim 256 --out " + fifo),
                        {fifo, "Broken pipe"});
  EXPECT_EQ(quitter.finish(), 1u);
  EXPECT_TRUE(is_kind(fifo, S_IFIFO));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST(HostilePaths, ASymlinkGivenAsOutputIsFollowedToADeviceAndRefusedToAFile) {
  const std::string dir = fresh_dir("paths_symlink_out");
  const std::string target = dir + "/target.safetensors", link = dir + "/link.safetensors";
  spill(target, "old");
  fs::create_symlink(target, link);
  // Replacing the link's file whole would replace the link: refused, both untouched.
  expect_one_line_error(run_bounded(kInit + link), {link, "symlink to a regular file"});
  EXPECT_TRUE(is_kind(link, S_IFLNK));
  EXPECT_EQ(slurp(target), "old");
  // The same for --json, before any step runs.
  expect_one_line_error(run_bounded(kTrain + "--steps 1 --json " + link),
                        {"--json", link, "symlink"});
  EXPECT_EQ(slurp(target), "old");
  // A dangling link.
  fs::create_symlink(dir + "/nowhere", dir + "/dangling");
  expect_one_line_error(run_bounded(kInit + dir + "/dangling"), {"symlink to a missing file"});
  EXPECT_TRUE(is_kind(dir + "/dangling", S_IFLNK));
  // A link to a device is written through: /dev/null takes it all, /dev/full says so.
  fs::create_symlink("/dev/null", dir + "/null");
  const CommandResult null = run_bounded(kInit + dir + "/null");
  EXPECT_EQ(null.code, 0) << null.output;
  EXPECT_TRUE(is_kind(dir + "/null", S_IFLNK));
  fs::create_symlink("/dev/full", dir + "/full");
  expect_one_line_error(run_bounded(kInit + dir + "/full"), {"No space left on device"});
  EXPECT_TRUE(is_kind(dir + "/full", S_IFLNK));
  // A directory is no file to write.
  fs::create_directories(dir + "/a_dir");
  expect_one_line_error(run_bounded(kInit + dir + "/a_dir"), {"a directory"});
  EXPECT_TRUE(is_kind(dir + "/a_dir", S_IFDIR));
}

// A checkpoint of kTrain after 2 steps, made once.
const std::string& base_checkpoint() {
  static const std::string dir = [] {
    const std::string d = fresh_dir("paths_base");
    EXPECT_EQ(run_bounded(kTrain + "--steps 2 --quiet --save-dir " + d).code, 0);
    return d;
  }();
  return dir;
}

// A token corpus like prepare-data's, small: DIR/train.bin, val.bin, meta.json.
std::string small_corpus(const std::string& name) {
  const std::string dir = fresh_dir(name);
  std::vector<uint16_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 61);
  data::write_token_file(dir + "/train.bin", tokens);
  data::write_token_file(dir + "/val.bin", tokens);
  data::write_corpus_meta(dir + "/meta.json", {61, 4000, 4000, 4.0, 5.8, 4.1});
  return dir;
}
const std::string kData =
    "train --backend cpu --world-size 1 --model transformer --layers 1 --dim 16 "
    "--heads 2 --seq-len 8 --tokens 16 --steps 2 --quiet --data ";

void make_fifo_at(const std::string& path) {
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << path;
}

TEST(HostilePaths, InputsThatAreNotRegularFilesAreRefusedWithoutWaiting) {
  const std::string dir = fresh_dir("paths_fifo_in");
  const std::string fifo = dir + "/in.fifo";
  make_fifo_at(fifo);
  expect_one_line_error(run_bounded(kTrain + "--steps 1 --init-from " + fifo),
                        {fifo, "a FIFO, not a regular file"});
  expect_one_line_error(run_bounded("report " + fifo), {fifo, "a FIFO"});
  // Each file of a checkpoint, read by a resume (COMPLETE and index.json by export alike).
  for (const std::string file : {"COMPLETE", "index.json", "rank-00001.safetensors"}) {
    const std::string ck = fresh_dir("paths_ck_" + file);
    fs::copy(base_checkpoint(), ck, fs::copy_options::recursive);
    make_fifo_at(ck + "/step-000002/" + file);
    expect_one_line_error(run_bounded(kTrain + "--steps 3 --resume " + ck), {file, "a FIFO"});
  }
  // COMPLETE that never ends.
  const std::string ck = fresh_dir("paths_ck_zero");
  fs::copy(base_checkpoint(), ck, fs::copy_options::recursive);
  fs::remove(ck + "/step-000002/COMPLETE");
  fs::create_symlink("/dev/zero", ck + "/step-000002/COMPLETE");
  expect_one_line_error(run_bounded(kTrain + "--steps 3 --resume " + ck),
                        {"COMPLETE", "a symlink to a character device"});
  // Each file of a corpus.
  ASSERT_EQ(run_bounded(kData + small_corpus("paths_data")).code, 0) << "the corpus trains";
  for (const std::string file : {"meta.json", "train.bin", "val.bin"}) {
    const std::string data = small_corpus("paths_data_" + file);
    make_fifo_at(data + "/" + file);
    expect_one_line_error(run_bounded(kData + data), {file, "a FIFO"});
  }
  const std::string data = small_corpus("paths_data_zero");
  fs::remove(data + "/meta.json");
  fs::create_symlink("/dev/zero", data + "/meta.json");
  expect_one_line_error(run_bounded(kData + data), {"meta.json", "character device"});
}

// A file of `bytes` bytes, sparse (nothing written).
void sparse_file(const std::string& path, uint64_t bytes) {
  fs::remove(path);
  spill(path, "");
  fs::resize_file(path, bytes);
}

TEST(HostilePaths, MetadataFilesLargerThanTheirLimitAreRefusedBeforeReading) {
  std::string ck = fresh_dir("paths_big_marker");
  fs::copy(base_checkpoint(), ck, fs::copy_options::recursive);
  sparse_file(ck + "/step-000002/COMPLETE", 40 << 20);
  expect_one_line_error(run_bounded(kTrain + "--steps 3 --resume " + ck),
                        {"COMPLETE", "more than the 32.0 MiB"});
  ck = fresh_dir("paths_big_index");
  fs::copy(base_checkpoint(), ck, fs::copy_options::recursive);
  sparse_file(ck + "/step-000002/index.json", uint64_t{300} << 20);
  expect_one_line_error(
      run_bounded("export --checkpoint " + ck + " --out " + ck + "/x.safetensors"),
      {"index.json", "more than the 256.0 MiB"});
  const std::string data = small_corpus("paths_big_meta");
  sparse_file(data + "/meta.json", 2 << 20);
  expect_one_line_error(run_bounded(kData + data), {"meta.json", "more than the 1.0 MiB"});
  // A safetensors header of 20 MiB (the reference reader allows 100 MB; real ones are KiB).
  const std::string init = fresh_dir("paths_big_header") + "/init.safetensors";
  RawSafetensors f;
  const std::string header = "{" + std::string(20 << 20, ' ') + "}";
  spill(init, f.bytes(&header));
  expect_one_line_error(run_bounded(kTrain + "--steps 1 --init-from " + init),
                        {init, "safetensors header of 20.0 MiB, more than the 16.0 MiB"});
}

// prepare-data proves its --out writable with a file it makes itself: what it finds there under
// the probe's old name, a FIFO (whose open would block) or a symlink (whose open would
// truncate what it names), is never opened. The missing input then ends the run.
TEST(HostilePaths, PrepareDataNeverOpensWhatItFindsInItsOutputDirectory) {
  const std::string dir = fresh_dir("paths_prepare_out");
  const std::string victim = fresh_dir("paths_prepare_victim") + "/keep.txt";
  spill(victim, "not yours");
  const std::string run = "prepare-data --vocab 300 --input " + dir + "/missing.txt --out " + dir;
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/.prepare-data-probe").c_str()), 0);
  expect_one_line_error(run_bounded(run), {"missing.txt does not exist"});
  EXPECT_EQ(slurp(victim), "not yours");
  fs::remove(dir + "/.prepare-data-probe");
  make_fifo_at(dir + "/.prepare-data-probe");
  expect_one_line_error(run_bounded(run), {"missing.txt does not exist"});
  EXPECT_TRUE(is_kind(dir + "/.prepare-data-probe", S_IFIFO));
}

TEST(HostilePaths, AbsurdModelSizesAreRefusedBeforeAnyAllocation) {
  for (const std::string flags :
       {"--layers 2147483647", "--dim 9223372036854775807", "--tokens 4611686018427387904",
        "--experts 2147483647 --model moe", "--rs-max-input-buffers 2147483647",
        "--capacity-factor 1e300 --model moe-transformer",
        "--layers 16384 --dim 262144 --tokens 4294967296"}) {
    SCOPED_TRACE(flags);
    const std::string model = flags.find("--model") == std::string::npos ? "--model mlp " : "";
    std::vector<std::string> commands{"train --backend cpu --world-size 1 --steps 1 "};
    if (flags == "--layers 2147483647")  // export --init checks the same flags the same way
      commands.push_back("export --init --out /nonexistent/x ");
    for (const std::string& command : commands) {
      const CommandResult r = run_bounded(command + model + flags);
      expect_one_line_error(r, {});
      EXPECT_TRUE(r.output.find("beyond any real") != std::string::npos ||
                  r.output.find("far more than any machine holds") != std::string::npos)
          << r.output;
    }
  }
}

}  // namespace
}  // namespace fsdp::testing
