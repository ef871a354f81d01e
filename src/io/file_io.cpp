#include "io/file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "fsdp/error.h"
#include "fsdp/out_of_memory.h"

namespace fsdp::io {

namespace {

std::mutex hook_mutex;
FaultHook fault_hook;
std::atomic<int64_t> write_budget{-1};
std::atomic<uint64_t> temp_counter{0};

std::string parent_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Takes `bytes` from the test write budget; false once it is spent (a "full disk").
bool take_write_budget(size_t bytes) {
  int64_t left = write_budget.load();
  while (left >= 0) {
    if (left < static_cast<int64_t>(bytes)) {
      write_budget.store(0);
      return false;
    }
    if (write_budget.compare_exchange_weak(left, left - static_cast<int64_t>(bytes))) return true;
  }
  return true;
}

// "a FIFO", "a directory", ...: what a mode names, for errors.
const char* kind_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a file";
}

FileIdentity identity_of(const struct stat& st) {
  return {st.st_dev, st.st_ino, static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

// A write to a FIFO whose reader went away raises SIGPIPE, which would end the process with
// no message: it is blocked for this thread while writing through (the signal goes to the
// writing thread), and one that the write raised is taken before it is unblocked; the write's
// EPIPE is the error.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlocked() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// Note [Output paths]: whether `path` is written through (true), atomically (false), or
// refused (an error naming it and what it is).
bool writes_through(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    FSDP_USER_CHECK(errno == ENOENT, "cannot write '", path, "': ", std::strerror(errno));
    return false;
  }
  if (S_ISREG(st.st_mode)) return false;
  const bool link = S_ISLNK(st.st_mode);
  if (link) {
    FSDP_USER_CHECK(::stat(path.c_str(), &st) == 0, "cannot write '", path,
                    "': it is a symlink to a missing file (give the path it should point to)");
    FSDP_USER_CHECK(!S_ISREG(st.st_mode), "cannot write '", path,
                    "': it is a symlink to a regular file, which a write would replace with a "
                    "file of its own (give the path it points to)");
  }
  FSDP_USER_CHECK(S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode), "cannot write '", path, "': it is ",
                  link ? "a symlink to " : "", kind_name(st.st_mode),
                  ", not a regular file, a character device or a FIFO");
  return true;
}

}  // namespace

uint32_t crc32_of(const void* data, size_t bytes, uint32_t crc) {
  return static_cast<uint32_t>(
      crc32_z(crc, static_cast<const Bytef*>(data), static_cast<z_size_t>(bytes)));
}

std::string size_text(uint64_t bytes) { return byte_size_text(bytes); }

// ---- reading (Note [Reading files])

ReadFile::ReadFile(const std::string& path) : path_(path) {
  struct stat st;
  FSDP_USER_CHECK(::stat(path.c_str(), &st) == 0, "cannot open '", path, "': ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    struct stat lst;
    const bool link = ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode);
    FSDP_USER_FAIL("cannot read '", path, "': it is ", link ? "a symlink to " : "",
                   kind_name(st.st_mode), ", not a regular file");
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  FSDP_USER_CHECK(fd_ >= 0, "cannot open '", path, "': ", std::strerror(errno));
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    FSDP_USER_FAIL("cannot read '", path, "': it changed into ", kind_name(st.st_mode),
                   " while being opened");
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  identity_ = identity_of(st);
}

ReadFile::~ReadFile() {
  if (fd_ >= 0) ::close(fd_);
}

void ReadFile::read_at(void* dst, uint64_t bytes, uint64_t offset) const {
  char* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, out, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      struct stat st;
      const uint64_t now = ::fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
      FSDP_USER_FAIL("cannot read '", path_, "' at byte ", offset, ": it holds ", now,
                     " bytes now, ", identity_.bytes,
                     " when it was opened (truncated while in use?)");
    }
    FSDP_USER_CHECK(n > 0, "cannot read '", path_, "' at byte ", offset, ": ", std::strerror(errno));
    out += n;
    bytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

std::string ReadFile::read_all(uint64_t max_bytes, const std::string& what) const {
  if (identity_.bytes > max_bytes) {
    // In bytes where the rounded sizes would read the same ("64.0 MiB, more than 64.0 MiB").
    const bool close = size_text(identity_.bytes) == size_text(max_bytes);
    auto text = [&](uint64_t b) { return close ? std::to_string(b) + " bytes" : size_text(b); };
    FSDP_USER_FAIL("'", path_, "' holds ", text(identity_.bytes), ", more than the ",
                   text(max_bytes), " that ", what, " may hold");
  }
  auto grew = [&] {
    FSDP_USER_FAIL("'", path_, "' grew past the ", size_text(max_bytes), " that ", what,
                   " may hold while it was read");
  };
  std::string out(identity_.bytes, '\0');
  size_t have = 0;
  for (;;) {  // to the end, which may not be where it was (a file that grows)
    if (have == out.size()) {
      if (out.size() > max_bytes) grew();
      out.resize(std::min<uint64_t>(max_bytes + 1, out.size() + std::max<uint64_t>(out.size() / 2, 65536)));
    }
    const ssize_t n = ::pread(fd_, out.data() + have, out.size() - have, static_cast<off_t>(have));
    if (n < 0 && errno == EINTR) continue;
    FSDP_USER_CHECK(n >= 0, "cannot read '", path_, "': ", std::strerror(errno));
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  if (have > max_bytes) grew();
  out.resize(have);
  return out;
}

std::string read_bounded_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  return ReadFile(path).read_all(max_bytes, what);
}

// ---- writing (Note [Atomic files], Note [Output paths])

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  through_ = writes_through(path_);
  if (through_) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    FSDP_USER_CHECK(fd_ >= 0, "cannot write '", path_, "': ",
                    errno == ENXIO ? "it is a FIFO that no process reads" : std::strerror(errno));
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    return;
  }
  for (int attempt = 0;; ++attempt) {
    temp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(temp_counter++);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd_ >= 0 || errno != EEXIST || attempt == 100) break;  // a stray temp of a past process
  }
  FSDP_USER_CHECK(fd_ >= 0, "cannot create '", temp_, "': ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !through_) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  crc_ = crc32_of(data, bytes, crc_);
  size_ += bytes;
  fault_point("write", path_);
  std::optional<SigpipeBlocked> no_sigpipe;
  if (through_) no_sigpipe.emplace();
  while (bytes > 0) {
    ssize_t n;
    if (!take_write_budget(bytes)) {
      n = -1;
      errno = ENOSPC;
    } else {
      n = ::write(fd_, p, bytes);
    }
    if (n < 0 && errno == EINTR) continue;
    FSDP_USER_CHECK(n > 0, "cannot write '", path_, "': ",
                    n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  FSDP_CHECK(!committed_, "'", path_, "' committed twice");
  fault_point("fsync", path_);
  if (!through_)  // a device or a FIFO has nothing to sync (and fsync fails on them)
    FSDP_USER_CHECK(::fsync(fd_) == 0, "cannot fsync '", temp_, "': ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  FSDP_USER_CHECK(::close(fd) == 0, "cannot close '", through_ ? path_ : temp_, "': ",
                  std::strerror(errno));
  fault_point("rename", path_);
  if (through_) {
    committed_ = true;
    return;
  }
  // Note [Output paths]: what appeared at the path meanwhile is refused, not replaced.
  FSDP_USER_CHECK(!writes_through(path_), "cannot write '", path_,
                  "': it became a device or a FIFO while being written");
  FSDP_USER_CHECK(::rename(temp_.c_str(), path_.c_str()) == 0, "cannot rename '", temp_, "' to '",
                  path_, "': ", std::strerror(errno));
  committed_ = true;
  fsync_directory(parent_of(path_));
}

void write_file_atomic(const std::string& path, const std::string& content) {
  AtomicFile f(path);
  f.write(content.data(), content.size());
  f.commit();
}

void check_output_path(const std::string& path) { writes_through(path); }

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  FSDP_USER_CHECK(fd >= 0, "cannot open directory '", dir, "': ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  FSDP_USER_CHECK(rc == 0, "cannot fsync directory '", dir, "': ", std::strerror(err));
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void set_fault_hook_for_testing(FaultHook hook) {
  std::lock_guard<std::mutex> lock(hook_mutex);
  fault_hook = std::move(hook);
}

void fault_point(const std::string& stage, const std::string& path) {
  static const char* crash_at = std::getenv("FSDP_TEST_CRASH_AT");
  if (crash_at) {
    const std::string want = crash_at;
    const size_t colon = want.find(':');
    const std::string suffix = colon == std::string::npos ? "" : want.substr(colon + 1);
    if (want.substr(0, colon) == stage && path.size() >= suffix.size() &&
        path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0)
      ::_exit(86);  // a crash: no destructors, no clean-up
  }
  FaultHook hook;
  {
    std::lock_guard<std::mutex> lock(hook_mutex);
    hook = fault_hook;
  }
  if (hook) hook(stage, path);
}

void set_write_budget_for_testing(int64_t bytes) { write_budget.store(bytes); }

}  // namespace fsdp::io
