// Files that are either fully written or not there: temp name, fsync, rename, fsync the
// directory (Note [Atomic files]). And the test hooks that simulate a crash or a full disk.
//
// Note [Atomic files]
// A reader must never see half a file under its final name. So every file is written to
// "<name>.tmp-<pid>" in the same directory, fsynced, renamed over <name> (rename(2) is atomic
// within a filesystem), and then the directory is fsynced so that the rename itself survives
// a power cut. A crash at any point leaves either the old state or the new one; at worst a
// stray temp file, which no reader looks at. Checksums (Note [Checkpoint checksums]) catch
// what the filesystem cannot: bit rot and files changed after the fact.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace fsdp::io {

// CRC-32 (zlib's, the polynomial of gzip and PNG), continued from `crc` (0 to start).
uint32_t crc32_of(const void* data, size_t bytes, uint32_t crc = 0);

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // not committed: the temp file is removed, the final name is untouched
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  // fsync, close, rename to the final name, fsync the directory.
  void commit();
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }

 private:
  std::string path_, temp_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint32_t crc_ = 0;
  bool committed_ = false;
};

void write_file_atomic(const std::string& path, const std::string& content);
std::string read_whole_file(const std::string& path);  // errors name the file
void fsync_directory(const std::string& dir);
bool path_exists(const std::string& path);
bool is_directory(const std::string& path);

// ---- test hooks
// Called at each named stage of a save (Note [Checkpoint save stages]); a hook that throws
// makes the save fail there. Every AtomicFile passes "write" (before each write), "fsync" (all
// written, under the temp name) and "rename". With FSDP_TEST_CRASH_AT set to "<stage>" or
// "<stage>:<path suffix>" (e.g. "rename:step-000004/COMPLETE") in the environment, the process
// exits at once (_exit, no clean-up) when it reaches that point: a real crash, for the
// command-line tests.
using FaultHook = std::function<void(const std::string& stage, const std::string& path)>;
void set_fault_hook_for_testing(FaultHook hook);
void fault_point(const std::string& stage, const std::string& path);
// Every write after `bytes` more bytes fails with ENOSPC, as on a full disk; -1: no limit.
void set_write_budget_for_testing(int64_t bytes);

}  // namespace fsdp::io
