// llm.c token files: the writer and the memory-mapped, validated reader (include/fsdp/data.h).
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

}  // namespace

void write_token_file(const std::string& path, std::span<const uint16_t> tokens) {
  FSDP_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), path,
             ": ", tokens.size(), " tokens do not fit the header's int32 count");
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) FSDP_USER_FAIL("cannot write ", path, ": ", errno_text());
  const bool ok = std::fwrite(header.data(), sizeof(int32_t), header.size(), f) == header.size() &&
                  (tokens.empty() ||  // fwrite's buffer must not be null, even for 0 items
                   std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f) == tokens.size());
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

uint16_t max_token(std::span<const uint16_t> tokens) {
  // Independent lanes so the loop vectorizes without -ffast-math (max is exact anyway).
  constexpr size_t kLanes = 32;
  std::array<uint16_t, kLanes> lane{};
  size_t i = 0;
  for (; i + kLanes <= tokens.size(); i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) lane[l] = std::max(lane[l], tokens[i + l]);
  uint16_t m = *std::max_element(lane.begin(), lane.end());
  for (; i < tokens.size(); ++i) m = std::max(m, tokens[i]);
  return m;
}

TokenFile::TokenFile(const std::string& path, int64_t vocab, int64_t min_tokens,
                     const std::string& purpose)
    : path_(path), vocab_(vocab) {
  FSDP_CHECK(vocab >= 1 && vocab <= kMaxTokenFileVocab, "vocab ", vocab,
             " is out of range for uint16 token files (1..", kMaxTokenFileVocab, ")");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) FSDP_USER_FAIL(path, ": cannot open: ", errno_text());
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    FSDP_USER_FAIL(path, ": cannot stat: ", why);
  }
  const int64_t file_bytes = st.st_size;
  if (file_bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    FSDP_USER_FAIL(path, ": truncated: ", file_bytes, " bytes, shorter than the ",
              kTokenFileHeaderBytes, "-byte header of a token file");
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_SHARED, fd, 0);
  const std::string map_error = map == MAP_FAILED ? errno_text() : "";
  ::close(fd);  // the mapping keeps the file open
  if (map == MAP_FAILED) FSDP_USER_FAIL(path, ": cannot map: ", map_error);
  map_ = map;
  map_bytes_ = static_cast<size_t>(file_bytes);
  // From here the destructor does not run on a throw; unmap before each failure.
  auto fail_unmapped = [&](const std::string& message) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    FSDP_USER_FAIL(message);
  };

  int32_t header[3];
  std::memcpy(header, map, sizeof header);
  if (header[0] != kTokenFileMagic)
    fail_unmapped(detail::concat(path, ": not a token file: magic ", header[0], ", expected ",
                                 kTokenFileMagic, " (llm.c's uint16 layout)"));
  if (header[1] != kTokenFileVersion)
    fail_unmapped(detail::concat(path, ": token file version ", header[1],
                                 " is not supported (expected ", kTokenFileVersion, ")"));
  const int64_t count = header[2];
  const int64_t expected = kTokenFileHeaderBytes + 2 * count;
  if (count < 0 || expected != file_bytes)
    fail_unmapped(detail::concat(path, ": ", expected > file_bytes ? "truncated" : "corrupt",
                                 ": the header says ", count, " tokens (", expected,
                                 " bytes) but the file has ", file_bytes, " bytes"));
  count_ = count;
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) +
                                              kTokenFileHeaderBytes);
  if (count_ < min_tokens)
    fail_unmapped(detail::concat(path, ": ", count_, " tokens, fewer than the ", min_tokens,
                                 " that ", purpose.empty() ? "this use" : purpose, " needs"));
  // Note [Token range check]: one vectorized max over the file at open (memory bandwidth:
  // ~0.1 s for 1e8 tokens), and a second, scalar pass only to name the first bad position.
  ::madvise(map_, map_bytes_, MADV_SEQUENTIAL);
  if (max_token(tokens()) >= vocab_) {
    const auto bad = std::find_if(tokens_, tokens_ + count_,
                                  [&](uint16_t t) { return t >= vocab_; });
    fail_unmapped(detail::concat(path, ": token ", *bad, " at position ", bad - tokens_,
                                 " is >= the vocabulary size ", vocab_));
  }
  ::madvise(map_, map_bytes_, MADV_RANDOM);  // training reads windows in random order
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

}  // namespace fsdp::data
