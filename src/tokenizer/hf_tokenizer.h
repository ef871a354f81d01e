// A Hugging Face tokenizer.json holding a byte-level BPE (Llama 3, Qwen2.5): what
// hf_tokenizer_json.cpp reads out of the file, and the tokenizer that runs it
// (hf_tokenizer.cpp). Note [Tokenizer files are refused, not guessed] in tokenizer.h.
//
// Encoding follows the `tokenizers` library's order:
//   1. added tokens whose "normalized" is false are cut out of the raw text (leftmost, then
//      longest, match first), and become their ids;
//   2. each stretch between them is normalized (nothing, or NFC), and added tokens whose
//      "normalized" is true are cut out of it the same way;
//   3. each remaining stretch is split by the pre-tokenizer's Split patterns in turn
//      (behaviour Isolated: matches and the text between them are pieces);
//   4. each piece's bytes are one word for the byte-level BPE (Note [Byte-level BPE]);
//   5. with add_special_tokens, the post-processor template's tokens go around the ids.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/byte_level_bpe.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"

namespace fsdp::tokenizer {

// Added tokens to cut out of a text: for each first byte, the tokens by their text and the
// lengths they come in, longest first, so a position costs one lookup per length.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  AddedTokenMatcher(const AddedTokenMatcher&) = delete;  // the index points into tokens_
  AddedTokenMatcher& operator=(const AddedTokenMatcher&) = delete;
  AddedTokenMatcher(AddedTokenMatcher&&) = default;
  AddedTokenMatcher& operator=(AddedTokenMatcher&&) = default;

  void add(std::string content, uint32_t id);
  // After the last add(): builds the index.
  void finish();
  // Calls piece(text, -1) for each stretch without an added token and piece("", id) for each
  // added token, in order: at each position the longest token that starts there, and the
  // leftmost position first, as `tokenizers` (its leftmost-longest Aho-Corasick) does.
  template <typename F>
  void split(std::string_view text, F&& piece) const {
    if (tokens_.empty()) {
      if (!text.empty()) piece(text, int64_t{-1});
      return;
    }
    size_t last = 0;
    for (size_t i = 0; i < text.size();) {
      const int64_t k = longest_at(text, i);
      if (k < 0) {
        ++i;
        continue;
      }
      if (i > last) piece(text.substr(last, i - last), int64_t{-1});
      piece(std::string_view(), static_cast<int64_t>(tokens_[k].second));
      i = last = i + tokens_[k].first.size();
    }
    if (last < text.size()) piece(text.substr(last), int64_t{-1});
  }

 private:
  struct Bucket {
    std::vector<size_t> lengths;                            // distinct, longest first
    std::unordered_map<std::string_view, uint32_t> tokens;  // text -> index into tokens_
  };
  int64_t longest_at(std::string_view text, size_t i) const;
  std::vector<std::pair<std::string, uint32_t>> tokens_;
  std::array<Bucket, 256> by_first_byte_;
};

struct HfTokenizerParts {
  std::string name;  // the file, first in every message
  ByteLevelBpe bpe;
  std::vector<std::string> decoded;                       // id -> the bytes it decodes to
  std::vector<bool> special;                              // id -> a special added token
  std::unordered_map<std::string, uint32_t> other_vocab;  // model tokens that are not byte-level
  std::unordered_map<std::string, uint32_t> added_ids;    // added token content -> id
  AddedTokenMatcher raw_added, normalized_added;
  bool nfc = false;
  std::vector<std::unique_ptr<RegexSplit>> splits;
  std::vector<uint32_t> prefix, suffix;  // the post-processor template around a text
  std::optional<uint32_t> bos, eos;
};

// Reads the file (and tokenizer_config.json's bytes, empty when there is none) into parts.
HfTokenizerParts read_tokenizer_json(std::string_view json, std::string_view config,
                                     const std::string& name);

class HfTokenizer final : public Tokenizer {
 public:
  explicit HfTokenizer(HfTokenizerParts parts) : p_(std::move(parts)) {}
  std::string description() const override { return "byte-level BPE (tokenizer.json)"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(p_.decoded.size()); }
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens) const override;
  std::optional<uint32_t> bos_id() const override { return p_.bos; }
  std::optional<uint32_t> eos_id() const override { return p_.eos; }
  std::optional<uint32_t> token_to_id(std::string_view token) const override;

 private:
  void pre_tokenize(std::string_view text, size_t level, RegexSplit::Scratch& scratch,
                    ByteLevelBpe::Cache& cache, std::vector<uint32_t>& out) const;
  HfTokenizerParts p_;
};

}  // namespace fsdp::tokenizer
