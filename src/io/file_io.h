// Every file we read or write goes through here: reads of regular files only, bounded, that
// never hang (Note [Reading files]); writes that are atomic and never replace what is not
// ours (Note [Atomic files], Note [Output paths]). And the test hooks that simulate a crash or
// a full disk.
//
// Note [Atomic files]
// A reader must never see half a file under its final name. So every regular file is written
// to a fresh "<name>.tmp-<pid>-<n>" in the same directory (created exclusively, never through a
// symlink), fsynced, renamed over <name> (rename(2) is atomic within a filesystem), and then
// the directory is fsynced so that the rename itself survives a power cut. A crash at any point
// leaves either the old state or the new one; at worst a stray temp file, which no reader looks
// at. Checksums (Note [Checkpoint checksums]) catch what the filesystem cannot: bit rot and
// files changed after the fact.
//
// Note [Output paths]
// A write must never replace what is not ours: renaming a temp file over /dev/full (as root)
// would replace the device node with a regular file. So what the path names decides, by lstat:
//   - nothing, or a regular file: written atomically (Note [Atomic files]);
//   - a character device or a FIFO (/dev/null, /dev/full, a named pipe): written through, in
//     place: no temp file, no rename, no fsync, and a write that fails (ENOSPC on /dev/full)
//     is the error. A FIFO is opened non-blocking, so one that no process reads is refused at
//     once rather than waited on; a reader that goes away is an error, not a SIGPIPE;
//   - a symlink is followed to see what it names: a device or a FIFO is written through as
//     above; a regular file is refused, since replacing it whole would replace the link with a
//     file (give the path it points to); a dangling link is refused;
//   - a directory, a block device or a socket: refused.
// The kind is checked again just before the rename, so a path that became something else in
// the meantime is refused then, not replaced.
//
// Note [Reading files]
// A path we read may name anything: a FIFO, whose open(2) blocks until some process writes
// (forever, and no --timeout covers it); a device that never ends (/dev/zero); a file that
// shrinks while it is read. So every reader opens through ReadFile: the path must name a
// regular file (a symlink counts as what it points to), checked with stat before opening, and
// again with fstat after an open that is non-blocking (a FIFO swapped in between cannot block
// it). Reads are preads that fail, naming the file and its size then and now, when it ends
// early. A file read whole (JSON metadata) has a limit, checked before reading and while
// reading (a file that grows), so that no input decides how much memory we take.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>

namespace fsdp::io {

// CRC-32 (zlib's, the polynomial of gzip and PNG), continued from `crc` (0 to start).
uint32_t crc32_of(const void* data, size_t bytes, uint32_t crc = 0);

// "12.0 MiB", "517 bytes": sizes in errors.
std::string size_text(uint64_t bytes);

// Which file a descriptor reads: two opens with equal identities read the same bytes (unless
// the file is rewritten in place within one mtime tick, which no reader can tell).
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
  auto operator<=>(const FileIdentity&) const = default;
};

// A regular file opened for reading (Note [Reading files]); errors name the file.
class ReadFile {
 public:
  explicit ReadFile(const std::string& path);
  ~ReadFile();
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }
  uint64_t bytes() const { return identity_.bytes; }  // its size when opened
  const FileIdentity& identity() const { return identity_; }
  // Exactly `bytes` bytes at `offset`; a file that ends before is an error that names it and
  // its size now and when opened (truncated while in use).
  void read_at(void* dst, uint64_t bytes, uint64_t offset) const;
  // The whole file, which must hold at most `max_bytes` (`what` names the kind of file in the
  // error: "a checkpoint's COMPLETE marker").
  std::string read_all(uint64_t max_bytes, const std::string& what) const;

 private:
  std::string path_;
  int fd_ = -1;
  FileIdentity identity_;
};

// ReadFile(path).read_all(max_bytes, what).
std::string read_bounded_file(const std::string& path, uint64_t max_bytes, const std::string& what);

// A file written whole (Note [Atomic files]) or, for a device or a FIFO, written through (Note
// [Output paths]); the constructor refuses a path that names something else.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // not committed: the temp file is removed, the final name is untouched
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  // A regular file: fsync, close, rename to the final name, fsync the directory. Written
  // through: close.
  void commit();
  const std::string& path() const { return path_; }
  bool written_through() const { return through_; }
  uint64_t size() const { return size_; }
  uint32_t crc() const { return crc_; }

 private:
  std::string path_, temp_;
  int fd_ = -1;
  bool through_ = false;
  uint64_t size_ = 0;
  uint32_t crc_ = 0;
  bool committed_ = false;
};

void write_file_atomic(const std::string& path, const std::string& content);
// Refuses, as AtomicFile would, a path that a write may not touch (Note [Output paths]); for
// the checks made before a long run.
void check_output_path(const std::string& path);
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
