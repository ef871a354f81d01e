// Each test process writes under a directory of its own. ctest runs every test as its own
// process, several at once: with one shared ::testing::TempDir(), two of them making the same
// "checkpoint_tests/hostile_base" removed each other's files mid-test. gtest's TempDir() reads
// TEST_TMPDIR on every call, so setting it here, before main, covers every test (and the
// fsdp commands they run, which inherit it); the directory goes when the process ends.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace {

struct ProcessTempDir {
  pid_t owner = ::getpid();
  std::string dir;

  ProcessTempDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    const std::string root = base && *base ? base : "/tmp";
    dir = root + "/fsdp_tests." + std::to_string(owner);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    ::setenv("TEST_TMPDIR", dir.c_str(), 1);
  }
  // A forked child that exits normally runs this too: only the process that made it removes it.
  ~ProcessTempDir() {
    if (::getpid() != owner) return;
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
};

const ProcessTempDir process_temp_dir;

}  // namespace
