// llm.c token files: the writer and the validated reader (include/fsdp/data.h).
#include <algorithm>
#include <array>
#include <limits>
#include <memory>

#include "fsdp/data.h"
#include "fsdp/error.h"
#include "io/file_io.h"

namespace fsdp::data {

void write_token_file(const std::string& path, std::span<const uint16_t> tokens) {
  FSDP_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), path,
             ": ", tokens.size(), " tokens do not fit the header's int32 count");
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  io::AtomicFile f(path);  // Note [Atomic files], Note [Output paths]
  f.write(header.data(), header.size() * sizeof(int32_t));
  if (!tokens.empty()) f.write(tokens.data(), tokens.size() * sizeof(uint16_t));
  f.commit();
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

struct TokenFile::Handle {
  explicit Handle(const std::string& path) : file(path) {}
  io::ReadFile file;
};

TokenFile::TokenFile(const std::string& path, int64_t vocab, int64_t min_tokens,
                     const std::string& purpose)
    : path_(path), vocab_(vocab) {
  FSDP_CHECK(vocab >= 1 && vocab <= kMaxTokenFileVocab, "vocab ", vocab,
             " is out of range for uint16 token files (1..", kMaxTokenFileVocab, ")");
  handle_ = std::make_unique<Handle>(path);  // Note [Reading files]: a regular file, or an error
  const int64_t file_bytes = static_cast<int64_t>(handle_->file.bytes());
  if (file_bytes < kTokenFileHeaderBytes)
    FSDP_USER_FAIL(path, ": truncated: ", file_bytes, " bytes, shorter than the ",
                   kTokenFileHeaderBytes, "-byte header of a token file");
  int32_t header[3];
  handle_->file.read_at(header, sizeof header, 0);
  if (header[0] != kTokenFileMagic)
    FSDP_USER_FAIL(path, ": not a token file: magic ", header[0], ", expected ", kTokenFileMagic,
                   " (llm.c's uint16 layout)");
  if (header[1] != kTokenFileVersion)
    FSDP_USER_FAIL(path, ": token file version ", header[1], " is not supported (expected ",
                   kTokenFileVersion, ")");
  const int64_t count = header[2];
  const int64_t expected = kTokenFileHeaderBytes + 2 * count;
  if (count < 0 || expected != file_bytes)
    FSDP_USER_FAIL(path, ": ", expected > file_bytes ? "truncated" : "corrupt", ": the header says ",
                   count, " tokens (", expected, " bytes) but the file has ", file_bytes, " bytes");
  count_ = count;
  if (count_ < min_tokens)
    FSDP_USER_FAIL(path, ": ", count_, " tokens, fewer than the ", min_tokens, " that ",
                   purpose.empty() ? "this use" : purpose, " needs");
  // Note [Token range check]: one vectorized max per chunk at open (memory bandwidth), and a
  // scalar pass only to name the first bad position.
  std::vector<uint16_t> chunk(1 << 19);
  for (int64_t at = 0; at < count_; at += static_cast<int64_t>(chunk.size())) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(chunk.size()), count_ - at);
    handle_->file.read_at(chunk.data(), static_cast<uint64_t>(n) * 2,
                          static_cast<uint64_t>(kTokenFileHeaderBytes + 2 * at));
    const std::span<const uint16_t> part(chunk.data(), static_cast<size_t>(n));
    if (max_token(part) >= vocab_) {
      const auto bad = std::find_if(part.begin(), part.end(), [&](uint16_t t) { return t >= vocab_; });
      FSDP_USER_FAIL(path, ": token ", *bad, " at position ", at + (bad - part.begin()),
                     " is >= the vocabulary size ", vocab_);
    }
  }
}

TokenFile::~TokenFile() = default;

void TokenFile::read(int64_t first, int64_t count, uint16_t* out) const {
  FSDP_CHECK(first >= 0 && count >= 0 && first + count <= count_, "tokens [", first, ", ",
             first + count, ") of the ", count_, " in ", path_);
  handle_->file.read_at(out, static_cast<uint64_t>(count) * 2,
                        static_cast<uint64_t>(kTokenFileHeaderBytes + 2 * first));
  for (int64_t i = 0; i < count; ++i)
    if (out[i] >= vocab_)
      FSDP_USER_FAIL(path_, ": token ", out[i], " at position ", first + i,
                     " is >= the vocabulary size ", vocab_,
                     " (the file changed after it was opened)");
}

std::vector<uint16_t> TokenFile::read_all() const {
  std::vector<uint16_t> out(static_cast<size_t>(count_));
  read(0, count_, out.data());
  return out;
}

}  // namespace fsdp::data
