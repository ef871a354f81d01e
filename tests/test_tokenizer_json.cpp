// The tokenizer.json reader on the fixtures (tests/fixtures/tokenizer): the ids of fixed
// strings and of a whole corpus file as Hugging Face's `tokenizers` gives them
// (expected_ids.json), decode(encode(s)) == s, the byte-level map, ignore_merges, the added
// tokens, the special tokens, threads. Built only with PCRE2 and utf8proc (CMakeLists.txt).
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "fsdp/error.h"
#include "tokenizer/byte_level_bpe.h"
#include "tokenizer/unicode_text.h"
#include "tokenizer_fixture.h"

namespace {

using fsdp::testing::expected_ids;
using fsdp::testing::fixture_path;
using fsdp::testing::fixture_tokenizer;
using fsdp::testing::read_text_file;
using Ids = std::vector<uint32_t>;

// Strings beyond the expected file's, for the round trip: every kind of text the fixtures'
// patterns split differently.
const char* const kRoundTripStrings[] = {"",
                                         "a",
                                         " ",
                                         "\n",
                                         "don't stop",
                                         "WE'LL see",
                                         "héllo wörld",
                                         "ça, où, naïve",
                                         "中文分词器测试",
                                         "日本語のテキスト",
                                         "🙂👍🏽👨\u200d👩\u200d👧🇫🇷",
                                         "1234567890",
                                         "x  y\t\tz\n\n\n",
                                         "   leading",
                                         "trailing   ",
                                         "\r\n\r\n",
                                         "<|endoftext|>",
                                         "a<|im_start|>b<|im_end|>c",
                                         "<|begin_of_text|><|begin_of_text|>",
                                         "<|endoftext",
                                         "line 1\nline 2\n  indented\n",
                                         "\xc3\xa9\xcc\x81",
                                         "Ω≈ç√∫˜µ≤≥÷"};

std::string nfc(const std::string& s) {
  return fsdp::tokenizer::nfc(s);
}

TEST(TokenizerByteLevel, Gpt2MapKeepsPrintableBytesAndShiftsTheRest) {
  using fsdp::tokenizer::byte_to_codepoint;
  EXPECT_EQ(byte_to_codepoint('!'), uint32_t{'!'});
  EXPECT_EQ(byte_to_codepoint('~'), uint32_t{'~'});
  EXPECT_EQ(byte_to_codepoint(0xA1), 0xA1u);
  EXPECT_EQ(byte_to_codepoint(0xFF), 0xFFu);
  EXPECT_EQ(byte_to_codepoint(0x00), 0x100u);  // the 68 others from U+0100, in byte order
  EXPECT_EQ(byte_to_codepoint(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_codepoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_codepoint(0x7F), 0x121u);
  EXPECT_EQ(byte_to_codepoint(0xA0), 0x142u);
  EXPECT_EQ(byte_to_codepoint(0xAD), 0x143u);  // the last
  std::string all, back;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  ASSERT_TRUE(
      fsdp::tokenizer::byte_level_to_bytes(fsdp::tokenizer::bytes_to_byte_level(all), back));
  EXPECT_EQ(back, all);
  EXPECT_EQ(fsdp::tokenizer::bytes_to_byte_level(" the\n"), "Ġthe\xc4\x8a");
  EXPECT_FALSE(
      fsdp::tokenizer::byte_level_to_bytes("\xe4\xb8\xad", back));  // 中 stands for no byte
}

// Every string of expected_ids.json: its ids, its ids with the special tokens, and the text
// its ids decode to (tokenizers' decode; for the NFC fixture, the NFC text).
TEST(TokenizerJson, FixedStringsGiveTheIdsOfHuggingFaceTokenizers) {
  const nlohmann::json& expected = expected_ids();
  ASSERT_TRUE(expected["variants"].contains("llama3_like"));
  ASSERT_TRUE(expected["variants"].contains("qwen2_like"));
  size_t checked = 0;
  for (const auto& [variant, cases] : expected["variants"].items()) {
    const auto tok = fixture_tokenizer(variant);
    for (const auto& c : cases["strings"]) {
      const std::string text = c["text"];
      EXPECT_EQ(tok->encode(text), c["ids"].get<Ids>()) << variant << " " << c["text"].dump();
      EXPECT_EQ(tok->encode(text, true), c["ids_with_special"].get<Ids>())
          << variant << " " << c["text"].dump();
      EXPECT_EQ(tok->decode(c["ids"].get<Ids>()), c["decoded"].get<std::string>())
          << variant << " " << c["text"].dump();
      ++checked;
    }
  }
  EXPECT_GE(checked, 2 * 80u);  // make_expected.py's 82 strings a variant
}

TEST(TokenizerJson, WholeCorpusFileGivesTheIdsOfHuggingFaceTokenizers) {
  const std::string corpus = read_text_file(fixture_path("corpus.txt"));
  for (const char* variant : {"llama3_like", "qwen2_like"}) {
    const auto& cases = expected_ids()["variants"][variant];
    ASSERT_TRUE(cases.contains("corpus")) << variant << ": expected_ids.json has no corpus ids";
    const Ids want = cases["corpus"]["ids"].get<Ids>();
    const Ids got = fixture_tokenizer(variant)->encode(corpus);
    ASSERT_EQ(got.size(), want.size()) << variant;
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << variant << " token " << i;
  }
}

TEST(TokenizerJson, DecodeOfEncodeGivesTheTextBack) {
  const auto llama = fixture_tokenizer("llama3_like");
  const auto qwen = fixture_tokenizer("qwen2_like");
  std::vector<std::string> texts(std::begin(kRoundTripStrings), std::end(kRoundTripStrings));
  texts.push_back(std::string("\0nul", 4));  // an embedded NUL byte
  texts.push_back(read_text_file(fixture_path("corpus.txt")));
  for (const std::string& s : texts) {
    EXPECT_EQ(llama->decode(llama->encode(s)), s) << s;
    // Qwen2.5's normalizer makes the text NFC first; decoding gives the NFC text.
    EXPECT_EQ(qwen->decode(qwen->encode(s)), nfc(s)) << s;
  }
  EXPECT_NE(nfc("cafe\xcc\x81"), "cafe\xcc\x81");  // the corpus holds decomposed accents
  EXPECT_EQ(nfc("cafe\xcc\x81"), "caf\xc3\xa9");
}

TEST(TokenizerJson, IgnoreMergesTakesAWholeWordThatIsOneToken) {
  // " tokenizer" is in the fixtures' vocabulary, but no merge builds it: Llama 3's
  // ignore_merges takes it whole; without it (Qwen2.5) the merges split it.
  const auto llama = fixture_tokenizer("llama3_like");
  const auto qwen = fixture_tokenizer("qwen2_like");
  const std::optional<uint32_t> whole = llama->token_to_id(" tokenizer");
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(llama->encode(" tokenizer"), Ids{*whole});
  const Ids split = qwen->encode(" tokenizer");
  EXPECT_GT(split.size(), 1u);
  EXPECT_EQ(qwen->decode(split), " tokenizer");
  EXPECT_EQ(llama->encode("tokenizer"), qwen->encode("tokenizer"));  // no space: not that token
}

TEST(TokenizerJson, AddedTokensAreCutOutOfTheTextAndSpecialOnesCanBeSkipped) {
  const auto qwen = fixture_tokenizer("qwen2_like");
  const uint32_t eot = *qwen->token_to_id("<|endoftext|>"),
                 start = *qwen->token_to_id("<|im_start|>");
  EXPECT_EQ(eot, 659u);
  EXPECT_EQ(start, 660u);
  EXPECT_EQ(qwen->encode("<|im_start|><|endoftext|>"), (Ids{start, eot}));
  const Ids ids = qwen->encode("hi<|endoftext|>there");
  ASSERT_EQ(std::count(ids.begin(), ids.end(), eot), 1);
  EXPECT_EQ(qwen->decode(ids), "hi<|endoftext|>there");
  EXPECT_EQ(qwen->decode(ids, /*skip_special_tokens=*/true), "hithere");
  // A token that only starts like one is text.
  const Ids partial = qwen->encode("<|endoftext");
  EXPECT_EQ(std::count(partial.begin(), partial.end(), eot), 0);
  // "한국" is a normalized, not special, added token: its jamo spelling matches it after
  // NFC, and skip_special_tokens keeps it.
  const uint32_t hanguk = *qwen->token_to_id("한국");
  EXPECT_EQ(hanguk, 662u);
  EXPECT_EQ(qwen->encode("한국"), Ids{hanguk});
  EXPECT_EQ(qwen->encode("\u1112\u1161\u11ab\u1100\u116e\u11a8"), Ids{hanguk});
  EXPECT_EQ(qwen->decode(Ids{hanguk}, true), "한국");
  // In the Llama 3 fixture it is no added token: plain BPE over its bytes.
  EXPECT_EQ(fixture_tokenizer("llama3_like")->encode("한국").size(), 6u);
}

TEST(TokenizerJson, SpecialTokensComeFromTheTemplateAndTheConfig) {
  const auto llama = fixture_tokenizer("llama3_like");
  const auto qwen = fixture_tokenizer("qwen2_like");
  EXPECT_EQ(llama->vocab_size(), 663);  // 659 model tokens and 4 added
  EXPECT_EQ(qwen->vocab_size(), 663);
  EXPECT_EQ(llama->bos_id(), std::optional<uint32_t>(659));  // <|begin_of_text|>
  EXPECT_EQ(llama->eos_id(), std::optional<uint32_t>(660));  // <|end_of_text|>
  EXPECT_EQ(llama->encode("", true), Ids{659});              // the template: bos first
  EXPECT_EQ(llama->encode("hi", true).front(), 659u);
  EXPECT_EQ(qwen->bos_id(), std::nullopt);
  EXPECT_EQ(qwen->eos_id(), std::optional<uint32_t>(659));  // <|endoftext|>
  EXPECT_TRUE(qwen->encode("", true).empty());              // adds nothing
  EXPECT_EQ(llama->token_to_id("no such token"), std::nullopt);
  // Without tokenizer_config.json, no bos or eos is named.
  const auto bare = fsdp::tokenizer::tokenizer_from_json(
      read_text_file(fixture_path("llama3_like/tokenizer.json")), "", "bare");
  EXPECT_EQ(bare->bos_id(), std::nullopt);
  EXPECT_EQ(bare->encode("", true), Ids{659});
}

TEST(TokenizerJson, BadTextAndBadIdsFailInOneLine) {
  const auto llama = fixture_tokenizer("llama3_like");
  try {
    llama->encode(std::string("ok \xff then", 9));
    FAIL() << "invalid UTF-8 was encoded";
  } catch (const fsdp::Error& e) {
    EXPECT_STREQ(e.what(),
                 "llama3_like/tokenizer.json: the text is not UTF-8: byte 3 (0xff) "
                 "starts no character");
  }
  for (const char* bad : {"\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe4\xb8"})
    EXPECT_THROW(llama->encode(bad), fsdp::Error) << "overlong, surrogate, > U+10FFFF, cut short";
  try {
    llama->decode(Ids{1, 663});
    FAIL() << "an id outside the vocabulary was decoded";
  } catch (const fsdp::Error& e) {
    EXPECT_STREQ(e.what(),
                 "llama3_like/tokenizer.json: id 663 is outside the vocabulary of 663 tokens");
  }
}

TEST(TokenizerJson, EncodingFromSeveralThreadsGivesTheSameIds) {
  const auto qwen = fixture_tokenizer("qwen2_like");
  const std::string corpus = read_text_file(fixture_path("corpus.txt"));
  const Ids want = qwen->encode(corpus);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] { got[t] = qwen->encode(corpus); });
  for (std::thread& t : threads) t.join();
  for (const Ids& g : got) EXPECT_EQ(g, want);
}

}  // namespace
