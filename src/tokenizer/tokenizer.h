// Tokenizers: text to ids and back, for `fsdp prepare-data` and text generation
// (docs/data.md). Two kinds, one interface:
//   - a Hugging Face tokenizer.json holding a byte-level BPE (Llama 3, Qwen2.5), read here
//     (hf_tokenizer_json.cpp): the added tokens, the normalizer (none or NFC, utf8proc), the
//     pre-tokenizer's Split regex (PCRE2), the BPE merges, the post-processor's template;
//   - a SentencePiece model, tokenizer.model (Llama 2, Mistral, the ones prepare-data trains).
//
// Note [Tokenizer files are refused, not guessed]
// A tokenizer.json may hold any of the `tokenizers` library's components. This reader knows
// the ones Llama 3 and Qwen2.5 use; any other component, key or setting that could change
// the ids (an unknown model type, normalizer, pre-tokenizer behaviour, a BPE flag, added
// tokens that strip spaces) is refused in one line naming it, never skipped. Keys that only
// change offsets (trim_offsets) are accepted and named in docs/data.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::tokenizer {

// Bounds on what a tokenizer file may hold; each is checked while reading, before storing.
inline constexpr int64_t kMaxTokenizerFileBytes = int64_t{64} << 20;  // Llama 3's is 9 MB
inline constexpr int64_t kMaxTokenizerConfigBytes = int64_t{16} << 20;
inline constexpr int64_t kMaxTokenizerVocab = int64_t{1} << 22;  // ids, and merges
inline constexpr int64_t kMaxTokenBytes = 4096;                  // one token's text
inline constexpr int64_t kMaxPatternBytes = 8192;                // the Split regex
inline constexpr int kMaxJsonDepth = 64;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // What it is, for messages ("byte-level BPE (tokenizer.json)", "SentencePiece").
  virtual std::string description() const = 0;
  // Every id is below this.
  virtual int64_t vocab_size() const = 0;
  // The ids of `text`. add_special_tokens: also the tokens the tokenizer puts around every
  // text, as Hugging Face's `tokenizer(text)` does (Llama 3's template: <|begin_of_text|>
  // first; SentencePiece: <s> first); encode("", true) is those tokens alone. Safe to call
  // from several threads at once. A tokenizer.json tokenizer needs UTF-8 (one-line error
  // naming the byte offset otherwise).
  virtual std::vector<uint32_t> encode(std::string_view text,
                                       bool add_special_tokens = false) const = 0;
  // The bytes of `ids`; decode(encode(s)) == s. The bytes of a prefix of the ids need not be
  // valid UTF-8 (a character may span tokens). skip_special_tokens leaves out special tokens
  // (SentencePiece always leaves out its control tokens <s> and </s>). An id outside the
  // vocabulary: one-line error.
  virtual std::string decode(std::span<const uint32_t> ids,
                             bool skip_special_tokens = false) const = 0;
  // Beginning and end of sequence, when the tokenizer names them (tokenizer.json: the
  // bos_token / eos_token of tokenizer_config.json beside it).
  virtual std::optional<uint32_t> bos_id() const = 0;
  virtual std::optional<uint32_t> eos_id() const = 0;
  // The id of a token given as its text ("<|eot_id|>", "hello"), if it is one token.
  virtual std::optional<uint32_t> token_to_id(std::string_view token) const = 0;
};

// A tokenizer and the files it came from (name in the directory, bytes as read), so that a
// caller can copy them beside its output.
struct LoadedTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::pair<std::string, std::string>> files;
  bool is_tokenizer_json = false;
};

// PATH is a tokenizer.json (any name ending in .json; a tokenizer_config.json in the same
// directory is read too), a SentencePiece model (ending in .model), or a directory holding
// tokenizer.json or tokenizer.model. The kind and size of each file are checked before it is
// read; every failure is one line naming the file.
LoadedTokenizer load_tokenizer(const std::string& path);

// From the bytes of a tokenizer.json and of its tokenizer_config.json (empty: none). `name`
// starts every message ("tokenizer.json"). Needs PCRE2 and utf8proc at build time.
std::unique_ptr<Tokenizer> tokenizer_from_json(std::string_view json, std::string_view config,
                                               const std::string& name);
// From a serialized SentencePiece model. Needs SentencePiece at build time.
std::unique_ptr<Tokenizer> tokenizer_from_sentencepiece(const std::string& model,
                                                        const std::string& name);

// The byte offset of the first byte of `text` that is not part of well-formed UTF-8 (no
// overlong forms, surrogates or code points above U+10FFFF), or npos.
size_t invalid_utf8_offset(std::string_view text);

// Whether this build reads tokenizer.json files (PCRE2 and utf8proc were found) and
// SentencePiece models.
bool reads_tokenizer_json();
bool reads_sentencepiece();

}  // namespace fsdp::tokenizer
