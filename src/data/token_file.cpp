// llm.c token files, both layouts: the writer and the validated, memory-mapped reader
// (include/fsdp/data.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "fsdp/data.h"
#include "fsdp/error.h"

namespace fsdp::data {

namespace {

std::string errno_text() { return std::strerror(errno); }

int64_t token_bytes(TokenDtype dtype) {
  return dtype == TokenDtype::kUint16 ? 2 : 4;
}

void write_raw(const std::string& path, TokenDtype dtype, const void* tokens, size_t count) {
  FSDP_CHECK(count <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), path, ": ", count,
             " tokens do not fit the header's int32 count");
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = dtype == TokenDtype::kUint16 ? kTokenFileMagic : kTokenFile32Magic;
  header[1] = dtype == TokenDtype::kUint16 ? kTokenFileVersion : kTokenFile32Version;
  header[2] = static_cast<int32_t>(count);
  const size_t width = static_cast<size_t>(token_bytes(dtype));
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) FSDP_USER_FAIL("cannot write ", path, ": ", errno_text());
  const bool ok = std::fwrite(header.data(), sizeof(int32_t), header.size(), f) == header.size() &&
                  (count == 0 ||  // fwrite's buffer must not be null, even for 0 items
                   std::fwrite(tokens, width, count, f) == count);
  const int saved_errno = errno;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    errno = ok ? errno : saved_errno;
    FSDP_USER_FAIL("cannot write ", path, ": ", errno_text());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    FSDP_USER_FAIL("cannot write ", path, ": ", errno_text());
  }
}

// Independent lanes so the loop vectorizes without -ffast-math (max is exact anyway).
template <typename T>
T lane_max(std::span<const T> tokens) {
  constexpr size_t kLanes = 64 / sizeof(T);
  std::array<T, kLanes> lane{};
  size_t i = 0;
  for (; i + kLanes <= tokens.size(); i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) lane[l] = std::max(lane[l], tokens[i + l]);
  T m = *std::max_element(lane.begin(), lane.end());
  for (; i < tokens.size(); ++i) m = std::max(m, tokens[i]);
  return m;
}

// The first token >= vocab, for the message; -1 when none.
template <typename T>
int64_t first_out_of_range(std::span<const T> tokens, int64_t vocab) {
  if (static_cast<int64_t>(lane_max(tokens)) < vocab) return -1;
  const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                [&](T t) { return static_cast<int64_t>(t) >= vocab; });
  return bad - tokens.begin();
}

// Closes the descriptor on every way out of the constructor's checks.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

const char* token_dtype_name(TokenDtype dtype) {
  return dtype == TokenDtype::kUint16 ? "uint16" : "uint32";
}

TokenDtype token_dtype_for_vocab(int64_t vocab) {
  return vocab <= kMaxTokenFileVocab ? TokenDtype::kUint16 : TokenDtype::kUint32;
}

void write_token_file(const std::string& path, std::span<const uint16_t> tokens) {
  write_raw(path, TokenDtype::kUint16, tokens.data(), tokens.size());
}

void write_token_file(const std::string& path, std::span<const uint32_t> tokens, TokenDtype dtype) {
  if (dtype == TokenDtype::kUint32) return write_raw(path, dtype, tokens.data(), tokens.size());
  FSDP_CHECK(tokens.empty() || lane_max(tokens) <= std::numeric_limits<uint16_t>::max(), path,
             ": token ", tokens.empty() ? 0 : lane_max(tokens), " does not fit a uint16 file");
  std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
  write_raw(path, dtype, narrow.data(), narrow.size());
}

uint16_t max_token(std::span<const uint16_t> tokens) {
  return lane_max(tokens);
}
uint32_t max_token(std::span<const uint32_t> tokens) {
  return lane_max(tokens);
}

TokenFile::TokenFile(const std::string& path, int64_t vocab, int64_t min_tokens,
                     const std::string& purpose)
    : path_(path), vocab_(vocab) {
  FSDP_CHECK(vocab >= 1 && vocab <= kMaxVocab, "vocab ", vocab,
             " is out of range for token files (1..", kMaxVocab, ")");
  // The kind of file first: opening a FIFO or a device could block or read forever.
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) FSDP_USER_FAIL(path, ": cannot open: ", errno_text());
  if (!S_ISREG(st.st_mode)) FSDP_USER_FAIL(path, ": not a regular file, so not a token file");
  const Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.fd < 0) FSDP_USER_FAIL(path, ": cannot open: ", errno_text());
  if (::fstat(file.fd, &st) != 0) FSDP_USER_FAIL(path, ": cannot stat: ", errno_text());
  if (!S_ISREG(st.st_mode)) FSDP_USER_FAIL(path, ": not a regular file, so not a token file");
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kTokenFileHeaderBytes)
    FSDP_USER_FAIL(path, ": truncated: ", file_bytes, " bytes, shorter than the ",
                   kTokenFileHeaderBytes, "-byte header of a token file");

  // The header, read and checked against the file's size before anything is mapped.
  int32_t header[3];
  if (::pread(file.fd, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header))
    FSDP_USER_FAIL(path, ": cannot read the header: ", errno_text());
  if (header[0] == kTokenFileMagic) {
    dtype_ = TokenDtype::kUint16;
    if (header[1] != kTokenFileVersion)
      FSDP_USER_FAIL(path, ": token file version ", header[1], " is not supported (magic ",
                     kTokenFileMagic, ", the uint16 layout, goes with version ", kTokenFileVersion,
                     ")");
  } else if (header[0] == kTokenFile32Magic) {
    dtype_ = TokenDtype::kUint32;
    if (header[1] != kTokenFile32Version)
      FSDP_USER_FAIL(path, ": token file version ", header[1], " is not supported (magic ",
                     kTokenFile32Magic, ", the uint32 layout, goes with version ",
                     kTokenFile32Version, ")");
  } else {
    FSDP_USER_FAIL(path, ": not a token file: magic ", header[0], ", expected ", kTokenFileMagic,
                   " (llm.c's uint16 layout) or ", kTokenFile32Magic, " (its uint32 layout)");
  }
  const int64_t count = header[2];
  const int64_t expected = kTokenFileHeaderBytes + token_bytes(dtype_) * count;
  if (count < 0 || expected != file_bytes)
    FSDP_USER_FAIL(path, ": ", expected > file_bytes ? "truncated" : "corrupt",
                   ": the header says ", count, " ", token_dtype_name(dtype_), " tokens (",
                   expected, " bytes) but the file has ", file_bytes, " bytes");
  if (count < min_tokens)
    FSDP_USER_FAIL(path, ": ", count, " tokens, fewer than the ", min_tokens, " that ",
                   purpose.empty() ? "this use" : purpose, " needs");

  void* map = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, file.fd, 0);
  if (map == MAP_FAILED) FSDP_USER_FAIL(path, ": cannot map: ", errno_text());
  map_ = map;  // the mapping keeps the file open once the descriptor closes
  map_bytes_ = static_cast<size_t>(file_bytes);
  count_ = count;
  tokens_ = static_cast<const char*>(map) + kTokenFileHeaderBytes;
  // Note [Token range check]: one vectorized max over the file at open (memory bandwidth:
  // ~0.1 s for 1e8 tokens), and a second, scalar pass only to name the first bad position.
  ::madvise(map_, map_bytes_, MADV_SEQUENTIAL);
  const int64_t bad = dtype_ == TokenDtype::kUint16 ? first_out_of_range(tokens(), vocab_)
                                                    : first_out_of_range(tokens32(), vocab_);
  if (bad >= 0) {
    const uint32_t t = token(bad);
    ::munmap(map_, map_bytes_);  // the destructor does not run on a throw
    map_ = nullptr;
    FSDP_USER_FAIL(path, ": token ", t, " at position ", bad, " is >= the vocabulary size ",
                   vocab_);
  }
  ::madvise(map_, map_bytes_, MADV_RANDOM);  // training reads windows in random order
}

std::span<const uint16_t> TokenFile::tokens() const {
  FSDP_CHECK(dtype_ == TokenDtype::kUint16, path_, " holds uint32 tokens, not uint16");
  return {static_cast<const uint16_t*>(tokens_), static_cast<size_t>(count_)};
}

std::span<const uint32_t> TokenFile::tokens32() const {
  FSDP_CHECK(dtype_ == TokenDtype::kUint32, path_, " holds uint16 tokens, not uint32");
  return {static_cast<const uint32_t*>(tokens_), static_cast<size_t>(count_)};
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

}  // namespace fsdp::data
