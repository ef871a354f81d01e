// llm.c token files, both layouts: the writer and the validated reader (include/fsdp/data.h).
#include <algorithm>
#include <array>
#include <limits>
#include <memory>

#include "fsdp/data.h"
#include "fsdp/error.h"
#include "io/file_io.h"

namespace fsdp::data {

namespace {

int64_t token_bytes(TokenDtype dtype) { return dtype == TokenDtype::kUint16 ? 2 : 4; }

void write_raw(const std::string& path, TokenDtype dtype, const void* tokens, size_t count) {
  FSDP_CHECK(count <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), path, ": ", count,
             " tokens do not fit the header's int32 count");
  std::array<int32_t, kTokenFileHeaderInts> header{};
  header[0] = dtype == TokenDtype::kUint16 ? kTokenFileMagic : kTokenFile32Magic;
  header[1] = dtype == TokenDtype::kUint16 ? kTokenFileVersion : kTokenFile32Version;
  header[2] = static_cast<int32_t>(count);
  io::AtomicFile f(path);  // Note [Atomic files], Note [Output paths]
  f.write(header.data(), header.size() * sizeof(int32_t));
  if (count > 0) f.write(tokens, count * static_cast<size_t>(token_bytes(dtype)));
  f.commit();
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
  if (tokens.empty() || static_cast<int64_t>(lane_max(tokens)) < vocab) return -1;
  const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                [&](T t) { return static_cast<int64_t>(t) >= vocab; });
  return bad - tokens.begin();
}

// Tokens [first, first + count) of a file of T, range checked; `changed` says the check is
// of a read after the open's (the file was rewritten in place).
template <typename T>
void read_checked(const io::ReadFile& file, int64_t first, int64_t count, int64_t vocab, T* out,
                  bool changed) {
  file.read_at(out, static_cast<uint64_t>(count) * sizeof(T),
               static_cast<uint64_t>(kTokenFileHeaderBytes + static_cast<int64_t>(sizeof(T)) * first));
  const int64_t bad = first_out_of_range(std::span<const T>(out, static_cast<size_t>(count)), vocab);
  if (bad >= 0)
    FSDP_USER_FAIL(file.path(), ": token ", out[bad], " at position ", first + bad,
                   " is >= the vocabulary size ", vocab,
                   changed ? " (the file changed after it was opened)" : "");
}

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

uint16_t max_token(std::span<const uint16_t> tokens) { return lane_max(tokens); }
uint32_t max_token(std::span<const uint32_t> tokens) { return lane_max(tokens); }

struct TokenFile::Handle {
  explicit Handle(const std::string& path) : file(path) {}
  io::ReadFile file;
};

TokenFile::TokenFile(const std::string& path, int64_t vocab, int64_t min_tokens,
                     const std::string& purpose)
    : path_(path), vocab_(vocab) {
  FSDP_USER_CHECK(vocab >= 1 && vocab <= kMaxVocab, path, ": a vocabulary of ", vocab,
                  " is outside what a token file holds (1..", kMaxVocab, ")");
  handle_ = std::make_unique<Handle>(path);  // Note [Reading files]: a regular file, or an error
  const int64_t file_bytes = static_cast<int64_t>(handle_->file.bytes());
  if (file_bytes < kTokenFileHeaderBytes)
    FSDP_USER_FAIL(path, ": truncated: ", file_bytes, " bytes, shorter than the ",
                   kTokenFileHeaderBytes, "-byte header of a token file");
  // The header, checked against the file's size before any token is read.
  int32_t header[3];
  handle_->file.read_at(header, sizeof header, 0);
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
  count_ = count;
  if (count_ < min_tokens)
    FSDP_USER_FAIL(path, ": ", count_, " tokens, fewer than the ", min_tokens, " that ",
                   purpose.empty() ? "this use" : purpose, " needs");
  // Note [Token range check]: one vectorized max per 1 MiB read at open (memory bandwidth),
  // and a scalar pass only to name the first bad position.
  std::vector<uint32_t> chunk(size_t{1} << 18);  // 1 MiB, of either layout
  const int64_t per_chunk = (int64_t{1} << 20) / token_bytes(dtype_);
  for (int64_t at = 0; at < count_; at += per_chunk) {
    const int64_t n = std::min(per_chunk, count_ - at);
    if (dtype_ == TokenDtype::kUint16)
      read_checked(handle_->file, at, n, vocab_, reinterpret_cast<uint16_t*>(chunk.data()), false);
    else
      read_checked(handle_->file, at, n, vocab_, chunk.data(), false);
  }
}

TokenFile::~TokenFile() = default;

void TokenFile::read(int64_t first, int64_t count, uint32_t* out) const {
  FSDP_CHECK(first >= 0 && count >= 0 && first <= count_ && count <= count_ - first, "tokens [",
             first, ", ", first + count, ") of the ", count_, " in ", path_);
  if (dtype_ == TokenDtype::kUint32) return read_checked(handle_->file, first, count, vocab_, out, true);
  // uint16: read as they are, then widened.
  std::vector<uint16_t> narrow(static_cast<size_t>(count));
  read_checked(handle_->file, first, count, vocab_, narrow.data(), true);
  std::copy(narrow.begin(), narrow.end(), out);
}

std::vector<uint32_t> TokenFile::read_all() const {
  std::vector<uint32_t> out(static_cast<size_t>(count_));
  read(0, count_, out.data());
  return out;
}

uint32_t TokenFile::token(int64_t i) const {
  uint32_t t = 0;
  read(i, 1, &t);
  return t;
}

}  // namespace fsdp::data
