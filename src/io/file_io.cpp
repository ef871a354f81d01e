#include "io/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "fsdp/error.h"

namespace fsdp::io {

namespace {

std::mutex hook_mutex;
FaultHook fault_hook;
std::atomic<int64_t> write_budget{-1};

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

}  // namespace

uint32_t crc32_of(const void* data, size_t bytes, uint32_t crc) {
  return static_cast<uint32_t>(
      crc32_z(crc, static_cast<const Bytef*>(data), static_cast<z_size_t>(bytes)));
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  temp_ = path_ + ".tmp-" + std::to_string(::getpid());
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FSDP_USER_CHECK(fd_ >= 0, "cannot create '", temp_, "': ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  crc_ = crc32_of(data, bytes, crc_);
  size_ += bytes;
  fault_point("write", path_);
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
  FSDP_USER_CHECK(::fsync(fd_) == 0, "cannot fsync '", temp_, "': ", std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  FSDP_USER_CHECK(::close(fd) == 0, "cannot close '", temp_, "': ", std::strerror(errno));
  fault_point("rename", path_);
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

std::string read_whole_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_USER_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      FSDP_USER_CHECK(n == 0, "cannot read '", path, "': ", std::strerror(err));
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

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
