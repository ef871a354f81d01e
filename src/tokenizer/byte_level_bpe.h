// Byte-level BPE (GPT-2's scheme, used by Llama 3 and Qwen2.5): every byte is a symbol of
// its own, and the ranked merges join neighbours, the best-ranked pair first.
//
// Note [Byte-level BPE]
// A byte-level vocabulary writes each byte as one printable character (GPT-2's
// bytes_to_unicode: the bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves, the
// other 68 bytes, in order, for U+0100 onwards; so a space is 'Ġ', U+0120). This class keeps
// every token as the raw bytes it stands for, so text is never mapped to those characters
// while encoding: a word's bytes are looked up directly. Merging follows the `tokenizers`
// library exactly: repeatedly the pair of lowest merge rank, the leftmost among equals, with
// ignore_merges (Llama 3) first taking a whole word that is one token as it is.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fsdp::tokenizer {

// GPT-2's byte to character map (Note [Byte-level BPE]): the code point that stands for byte b.
uint32_t byte_to_codepoint(unsigned char b);
// The raw bytes a byte-level token string stands for; false when it holds a character that
// stands for no byte (then it is not a byte-level token).
bool byte_level_to_bytes(std::string_view token, std::string& bytes);
// The byte-level string of raw bytes (UTF-8 of the mapped characters), for messages and tests.
std::string bytes_to_byte_level(std::string_view bytes);

class ByteLevelBpe {
 public:
  // Words (the pre-tokenizer's pieces) longer than this are not cached.
  static constexpr size_t kMaxCachedWordBytes = 256;

  // token -> id for the tokens that are byte-level (their raw bytes), in the given order.
  void add_token(std::string bytes, uint32_t id);
  // A merge of the tokens with ids `left` and `right` into `merged`, at `rank` (lower merges
  // first). A later merge of the same pair replaces the earlier, as in `tokenizers`.
  void add_merge(uint32_t left, uint32_t right, uint32_t merged, uint32_t rank);
  // After every token: finds the 256 single-byte tokens; false (and the byte) when one lacks.
  bool finish(int& missing_byte);
  void set_ignore_merges(bool on) { ignore_merges_ = on; }

  // The id of a token given by its raw bytes, or -1.
  int64_t find(std::string_view bytes) const;
  // Appends the ids of one word (raw bytes, non-empty) to `out`.
  void encode_word(std::string_view word, std::vector<uint32_t>& out) const;

  // Memoizes encode_word for one call's many repeated words (each caller owns one).
  class Cache {
   public:
    void encode(const ByteLevelBpe& bpe, std::string_view word, std::vector<uint32_t>& out);

   private:
    static constexpr size_t kMaxEntries = size_t{1} << 16;
    std::unordered_map<std::string, std::vector<uint32_t>> words_;
  };

 private:
  struct MergeTarget {
    uint32_t rank, merged;
  };
  const MergeTarget* merge_of(uint32_t left, uint32_t right) const;

  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<uint64_t, MergeTarget> merges_;
  std::array<uint32_t, 256> byte_ids_{};
  bool ignore_merges_ = false;
};

}  // namespace fsdp::tokenizer
