// llm.c token files, both layouts (uint16 and uint32): the round trip, and one one-line error
// per kind of bad file.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "fsdp/data.h"
#include "fsdp/error.h"

namespace {

using fsdp::data::TokenFile;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "data_" + name; }

std::vector<uint16_t> counting_tokens(int64_t n, int64_t vocab) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<uint16_t>((i * 7) % vocab);
  return t;
}

// Writes raw bytes: a header of our choosing, then `tokens` (uint16 or uint32).
template <typename T = uint16_t>
void write_raw(const std::string& path, int32_t magic, int32_t version, int32_t count,
               const std::vector<T>& tokens) {
  std::vector<int32_t> header(fsdp::data::kTokenFileHeaderInts, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(T));
}

std::vector<uint32_t> wide_tokens(int64_t n) {  // ids past uint16, up to Llama 3's vocabulary
  std::vector<uint32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<uint32_t>((i * 7919) % 128256);
  return t;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The error of opening `path`, which must be exactly one line naming the file.
std::string open_error(const std::string& path, int64_t vocab, int64_t min_tokens = 0) {
  try {
    TokenFile f(path, vocab, min_tokens, "one batch");
  } catch (const fsdp::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    return msg;
  }
  ADD_FAILURE() << path << " opened without an error";
  return "";
}

TEST(DataTokenFile, RoundTripKeepsEveryTokenAndTheLlmcHeader) {
  const std::string path = temp_path("round_trip.bin");
  std::vector<uint16_t> tokens = counting_tokens(1000, 50257);
  tokens[17] = 65535;  // the largest uint16 survives
  fsdp::data::write_token_file(path, tokens);

  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_EQ(static_cast<int64_t>(in.tellg()), 1024 + 2 * 1000);
  in.seekg(0);
  int32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 1000);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0) << i;

  TokenFile f(path, 65536, 1000);
  EXPECT_EQ(f.size(), 1000);
  EXPECT_EQ(f.read_all(), std::vector<uint32_t>(tokens.begin(), tokens.end()));
}

TEST(DataTokenFile, EmptyFileRoundTrips) {
  const std::string path = temp_path("empty.bin");
  fsdp::data::write_token_file(path, {});
  TokenFile f(path, 10);
  EXPECT_EQ(f.size(), 0);
}

TEST(DataTokenFile, Uint32RoundTripKeepsEveryTokenAndTheLlama3Header) {
  const std::string path = temp_path("round_trip_u32.bin");
  std::vector<uint32_t> tokens = wide_tokens(1000);
  tokens[3] = 65536;                     // the first id a uint16 file cannot hold
  tokens[17] = (uint32_t{1} << 31) - 1;  // the largest id a batch's int32 holds
  fsdp::data::write_token_file(path, tokens, fsdp::data::TokenDtype::kUint32);

  const std::string bytes = file_bytes(path);
  ASSERT_EQ(bytes.size(), 1024u + 4 * 1000);
  int32_t header[256];
  std::memcpy(header, bytes.data(), sizeof header);
  EXPECT_EQ(header[0], 20240801);  // llm.c's dev/data/data_common.py, "llama-3"
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 1000);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0) << i;

  TokenFile f(path, int64_t{1} << 31, 1000);
  EXPECT_EQ(f.dtype(), fsdp::data::TokenDtype::kUint32);
  EXPECT_EQ(f.size(), 1000);
  EXPECT_EQ(f.read_all(), tokens);
  for (int64_t i : {0, 3, 17, 999}) EXPECT_EQ(f.token(i), tokens[static_cast<size_t>(i)]) << i;
}

TEST(DataTokenFile, Uint16FilesWrittenFromWideIdsAreTheUint16Layout) {
  std::vector<uint16_t> narrow = counting_tokens(300, 65536);
  narrow[5] = 65535;
  const std::vector<uint32_t> wide(narrow.begin(), narrow.end());
  fsdp::data::write_token_file(temp_path("narrow.bin"), narrow);
  fsdp::data::write_token_file(temp_path("wide_as_narrow.bin"), wide,
                               fsdp::data::TokenDtype::kUint16);
  EXPECT_EQ(file_bytes(temp_path("narrow.bin")), file_bytes(temp_path("wide_as_narrow.bin")));
  TokenFile f(temp_path("wide_as_narrow.bin"), 65536);
  EXPECT_EQ(f.dtype(), fsdp::data::TokenDtype::kUint16);
  EXPECT_EQ(f.token(5), 65535u);
}

TEST(DataTokenFile, TheLayoutFollowsTheVocabulary) {
  using fsdp::data::TokenDtype;
  EXPECT_EQ(fsdp::data::token_dtype_for_vocab(4096), TokenDtype::kUint16);
  EXPECT_EQ(fsdp::data::token_dtype_for_vocab(65536), TokenDtype::kUint16);  // ids 0..65535
  EXPECT_EQ(fsdp::data::token_dtype_for_vocab(65537), TokenDtype::kUint32);
  EXPECT_EQ(fsdp::data::token_dtype_for_vocab(128256), TokenDtype::kUint32);  // Llama 3
  EXPECT_STREQ(fsdp::data::token_dtype_name(TokenDtype::kUint32), "uint32");
}

TEST(DataTokenFile, WrongMagicIsNamed) {
  const std::string path = temp_path("magic.bin");
  write_raw(path, 20240521, 1, 10, counting_tokens(10, 100));
  const std::string msg = open_error(path, 100);
  EXPECT_NE(msg.find("not a token file: magic 20240521, expected 20240520 (llm.c's uint16 "
                     "layout) or 20240801 (its uint32 layout)"),
            std::string::npos)
      << msg;
}

TEST(DataTokenFile, AVersionThatDoesNotGoWithTheMagicIsNamed) {
  const std::string path = temp_path("version.bin");
  write_raw(path, 20240520, 7, 10, counting_tokens(10, 100));  // uint32's version, uint16's magic
  std::string msg = open_error(path, 100);
  EXPECT_NE(msg.find("token file version 7 is not supported (magic 20240520, the uint16 layout, "
                     "goes with version 1)"),
            std::string::npos)
      << msg;
  write_raw(path, 20240801, 1, 10, wide_tokens(10));
  msg = open_error(path, 200000);
  EXPECT_NE(msg.find("token file version 1 is not supported (magic 20240801, the uint32 layout, "
                     "goes with version 7)"),
            std::string::npos)
      << msg;
}

TEST(DataTokenFile, TruncatedFilesAreNamed) {
  const std::string path = temp_path("truncated.bin");
  write_raw(path, 20240520, 1, 10, counting_tokens(9, 100));
  std::string msg = open_error(path, 100);
  EXPECT_NE(msg.find("truncated: the header says 10 uint16 tokens (1044 bytes) but the file has "
                     "1042 bytes"),
            std::string::npos)
      << msg;
  // Shorter than the header itself.
  std::ofstream(path, std::ios::binary | std::ios::trunc).write("abcd", 4);
  msg = open_error(path, 100);
  EXPECT_NE(msg.find("truncated: 4 bytes"), std::string::npos) << msg;
  // Longer than the header says: not silently ignored either.
  write_raw(path, 20240520, 1, 10, counting_tokens(11, 100));
  msg = open_error(path, 100);
  EXPECT_NE(msg.find("corrupt: the header says 10 uint16 tokens"), std::string::npos) << msg;
  // A uint32 header over uint16-sized tokens: the sizes disagree, so it is refused.
  write_raw(path, 20240801, 7, 10, counting_tokens(10, 100));
  msg = open_error(path, 100);
  EXPECT_NE(msg.find("truncated: the header says 10 uint32 tokens (1064 bytes) but the file has "
                     "1044 bytes"),
            std::string::npos)
      << msg;
  // A negative count.
  write_raw(path, 20240801, 7, -1, wide_tokens(0));
  msg = open_error(path, 100);
  EXPECT_NE(msg.find("the header says -1 uint32 tokens"), std::string::npos) << msg;
}

TEST(DataTokenFile, WhatIsNotARegularFileIsRefusedWithoutOpeningIt) {
  const std::string dir = temp_path("a_directory");
  std::filesystem::create_directories(dir);
  EXPECT_NE(open_error(dir, 100).find("not a regular file"), std::string::npos);
  // A FIFO with no writer: opening it for reading would block forever.
  const std::string fifo = temp_path("a_fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(open_error(fifo, 100).find("not a regular file"), std::string::npos);
  std::filesystem::remove(fifo);
}

TEST(DataTokenFile, Uint32TokenOutsideTheVocabularyIsNamedWithItsPosition) {
  const std::string path = temp_path("vocab_u32.bin");
  std::vector<uint32_t> tokens = wide_tokens(5000);
  tokens[4321] = 128256;
  tokens[4400] = 4000000000u;  // past int32: refused, never wrapped negative
  fsdp::data::write_token_file(path, tokens, fsdp::data::TokenDtype::kUint32);
  const std::string msg = open_error(path, 128256);
  EXPECT_NE(msg.find("token 128256 at position 4321 is >= the vocabulary size 128256"),
            std::string::npos)
      << msg;
  EXPECT_NE(open_error(path, int64_t{1} << 31).find("token 4000000000 at position 4400"),
            std::string::npos);
}

TEST(DataTokenFile, TokenOutsideTheVocabularyIsNamedWithItsPosition) {
  const std::string path = temp_path("vocab.bin");
  std::vector<uint16_t> tokens = counting_tokens(5000, 100);
  tokens[4321] = 100;
  tokens[4400] = 60000;
  fsdp::data::write_token_file(path, tokens);
  const std::string msg = open_error(path, 100);
  EXPECT_NE(msg.find("token 100 at position 4321 is >= the vocabulary size 100"),
            std::string::npos) << msg;
  EXPECT_NO_THROW(TokenFile(path, 60001));
}

TEST(DataTokenFile, FewerTokensThanOneBatchIsNamed) {
  const std::string path = temp_path("short.bin");
  fsdp::data::write_token_file(path, counting_tokens(64, 100));
  const std::string msg = open_error(path, 100, 65);
  EXPECT_NE(msg.find("64 tokens, fewer than the 65 that one batch needs"), std::string::npos)
      << msg;
  EXPECT_NO_THROW(TokenFile(path, 100, 64));
}

TEST(DataTokenFile, MissingFileIsNamed) {
  const std::string msg = open_error(temp_path("no_such_file.bin"), 100);
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST(DataTokenFile, MaxTokenMatchesAPlainLoopAtEveryLength) {
  for (size_t n : {0u, 1u, 15u, 16u, 17u, 31u, 32u, 33u, 100u, 1000u}) {
    std::vector<uint16_t> t(n);
    std::vector<uint32_t> w(n);
    for (size_t i = 0; i < n; ++i) {
      t[i] = static_cast<uint16_t>((i * 2654435761u) >> 16);
      w[i] = static_cast<uint32_t>(i * 2654435761u);
    }
    uint16_t expected = 0;
    uint32_t expected_wide = 0;
    for (size_t i = 0; i < n; ++i) {
      expected = std::max(expected, t[i]);
      expected_wide = std::max(expected_wide, w[i]);
    }
    EXPECT_EQ(fsdp::data::max_token(std::span<const uint16_t>(t)), expected) << n;
    EXPECT_EQ(fsdp::data::max_token(std::span<const uint32_t>(w)), expected_wide) << n;
  }
}

TEST(DataTokenFile, UnigramEntropyOfKnownDistributions) {
  // Uniform over 4 tokens: ln 4 nats = 2 bits.
  std::vector<uint16_t> uniform = {0, 1, 2, 3, 3, 2, 1, 0};
  EXPECT_NEAR(fsdp::data::unigram_entropy_nats(uniform), std::log(4.0), 1e-12);
  // p = (3/4, 1/4).
  std::vector<uint16_t> skewed = {5, 5, 5, 9};
  EXPECT_NEAR(fsdp::data::unigram_entropy_nats(skewed),
              -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)), 1e-12);
  // Cross-entropy with add-one smoothing over vocab 4: counts {2,2,2,2}+1 over 8+4.
  EXPECT_NEAR(fsdp::data::unigram_cross_entropy_nats(uniform, std::vector<uint16_t>{0, 3}, 4),
              -std::log(3.0 / 12.0), 1e-12);
  // uint32 ids: the same values, and ids past uint16 count like any other.
  const std::vector<uint32_t> wide = {100000, 100001, 100002, 3, 3, 100002, 100001, 100000};
  EXPECT_DOUBLE_EQ(fsdp::data::unigram_entropy_nats(wide, 128256),
                   fsdp::data::unigram_entropy_nats(uniform));
  EXPECT_NEAR(
      fsdp::data::unigram_cross_entropy_nats(wide, std::vector<uint32_t>{3, 100000}, 128256),
      -std::log(3.0 / (8 + 128256)), 1e-12);
}

TEST(DataTokenFile, CorpusMetaRoundTrips) {
  const std::string path = temp_path("meta.json");
  fsdp::data::CorpusMeta m{4096, 1000, 100, 6.5, 6.5 / std::log(2.0), 6.75};
  fsdp::data::write_corpus_meta(path, m);
  fsdp::data::CorpusMeta r = fsdp::data::read_corpus_meta(path);
  EXPECT_EQ(r.vocab, 4096);
  EXPECT_EQ(r.train_tokens, 1000);
  EXPECT_EQ(r.val_tokens, 100);
  EXPECT_DOUBLE_EQ(r.unigram_entropy_nats, 6.5);
  EXPECT_DOUBLE_EQ(r.unigram_entropy_bits, 6.5 / std::log(2.0));
  EXPECT_DOUBLE_EQ(r.val_unigram_cross_entropy_nats, 6.75);
  EXPECT_EQ(r.token_dtype, fsdp::data::TokenDtype::kUint16);
  EXPECT_EQ(r.tokenizer, "tokenizer.model");

  m.vocab = 128256;
  m.token_dtype = fsdp::data::TokenDtype::kUint32;
  m.tokenizer = "tokenizer.json";
  fsdp::data::write_corpus_meta(path, m);
  r = fsdp::data::read_corpus_meta(path);
  EXPECT_EQ(r.vocab, 128256);
  EXPECT_EQ(r.token_dtype, fsdp::data::TokenDtype::kUint32);
  EXPECT_EQ(r.tokenizer, "tokenizer.json");
}

TEST(DataTokenFile, CorpusMetaFromBeforeUint32FilesReadsAsUint16) {
  const std::string path = temp_path("old_meta.json");
  std::ofstream(path) << R"({"vocab": 4096, "train_tokens": 10, "val_tokens": 2,
    "unigram_entropy_nats": 6.4, "unigram_entropy_bits": 9.2, "val_unigram_cross_entropy_nats": 6.5})";
  const fsdp::data::CorpusMeta r = fsdp::data::read_corpus_meta(path);
  EXPECT_EQ(r.token_dtype, fsdp::data::TokenDtype::kUint16);
  EXPECT_EQ(r.tokenizer, "tokenizer.model");
  std::ofstream(path) << R"({"vocab": 4096, "train_tokens": 10, "val_tokens": 2,
    "unigram_entropy_nats": 6.4, "unigram_entropy_bits": 9.2, "val_unigram_cross_entropy_nats": 6.5,
    "token_dtype": "int8"})";
  try {
    fsdp::data::read_corpus_meta(path);
    FAIL() << "a token_dtype of int8 was accepted";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token_dtype must be \"uint16\" or \"uint32\", not \"int8\""),
              std::string::npos)
        << e.what();
  }
}

// Reads are preads, not a mapping (whose read past a truncation is a SIGBUS): a file cut or
// rewritten after it was opened is a one-line error naming it.
TEST(DataTokenFile, AFileCutOrRewrittenAfterOpeningIsAnErrorNotASignal) {
  const std::string path = temp_path("cut.bin");
  fsdp::data::write_token_file(path, counting_tokens(1000, 100));
  TokenFile f(path, 100);
  std::vector<uint32_t> window(11);
  f.read(900, 11, window.data());
  EXPECT_EQ(window[0], (900 * 7) % 100);
  std::filesystem::resize_file(path, 1024 + 2 * 500);
  try {
    f.read(900, 11, window.data());
    ADD_FAILURE() << "read past the end";
  } catch (const fsdp::UserError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot read '" + path + "' at byte 2824: it holds 2024 bytes now, "
                                     "3024 when it was opened (truncated while in use?)");
  }
  // Rewritten in place with a token past the vocabulary (the open's check is long past).
  std::filesystem::resize_file(path, 1024 + 2 * 1000);
  {
    std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(1024 + 2 * 905);
    const uint16_t big = 5000;
    out.write(reinterpret_cast<const char*>(&big), 2);
  }
  try {
    f.read(900, 11, window.data());
    ADD_FAILURE() << "a token past the vocabulary was read";
  } catch (const fsdp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("token 5000 at position 905 is >= the vocabulary size 100"),
              std::string::npos) << e.what();
  }
}

// The same for the uint32 layout (Llama 3's): its reads are preads of 4-byte tokens.
TEST(DataTokenFile, AUint32FileCutOrRewrittenAfterOpeningIsAnErrorNotASignal) {
  const std::string path = temp_path("cut32.bin");
  std::vector<uint32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 70000 + static_cast<uint32_t>(i);
  fsdp::data::write_token_file(path, tokens, fsdp::data::TokenDtype::kUint32);
  TokenFile f(path, 80000);
  std::vector<uint32_t> window(11);
  f.read(900, 11, window.data());
  EXPECT_EQ(window[0], 70900u);
  EXPECT_EQ(f.token(999), 70999u);
  std::filesystem::resize_file(path, 1024 + 4 * 500);
  try {
    f.read(900, 11, window.data());
    ADD_FAILURE() << "read past the end";
  } catch (const fsdp::UserError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot read '" + path + "' at byte 4624: it holds 3024 bytes now, "
                                     "5024 when it was opened (truncated while in use?)");
  }
  std::filesystem::resize_file(path, 1024 + 4 * 1000);
  {
    std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
    out.seekp(1024 + 4 * 905);
    const uint32_t big = 90000;
    out.write(reinterpret_cast<const char*>(&big), 4);
  }
  try {
    f.read(900, 11, window.data());
    ADD_FAILURE() << "a token past the vocabulary was read";
  } catch (const fsdp::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("token 90000 at position 905 is >= the vocabulary size 80000"),
              std::string::npos) << e.what();
  }
}

TEST(DataTokenFile, CorpusMetaWithMistypedOrMissingFieldsIsNamedInPlainWords) {
  const std::string path = temp_path("bad_meta.json");
  for (const auto& [text, expect] : std::vector<std::pair<std::string, std::string>>{
           {R"({"vocab": "4096"})", "vocab must be an integer in [1, 2147483648], not a string"},
           {R"({"vocab": 3000000000})", "vocab must be an integer in [1, 2147483648]"},
           {R"({"vocab": 4096, "train_tokens": 1, "val_tokens": 1, "unigram_entropy_nats": 1,
                "unigram_entropy_bits": 1, "val_unigram_cross_entropy_nats": 1,
                "tokenizer": "../../etc/passwd"})",
            "tokenizer must name a file in the corpus directory"},
           {R"({"vocab": 4096, "train_tokens": 1, "val_tokens": 1, "unigram_entropy_nats": 1,
                "unigram_entropy_bits": 1, "val_unigram_cross_entropy_nats": 1,
                "token_dtype": 16})",
            "token_dtype must be a string, not the integer 16"},
           {R"({"vocab": 4096})", "train_tokens is missing"},
           {R"([1, 2])", "the top level must be an object"},
           {R"({"vocab": 4096, "train_tokens": 1, "val_tokens": 1, "unigram_entropy_nats": "x"})",
            "unigram_entropy_nats must be a number, not a string"},
           {"{\"vocab\": ", "is corrupt: not valid JSON"}}) {
    std::ofstream(path, std::ios::trunc) << text;
    try {
      fsdp::data::read_corpus_meta(path);
      ADD_FAILURE() << text;
    } catch (const fsdp::UserError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find(expect), std::string::npos) << m;
      EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
    }
  }
}

}  // namespace
