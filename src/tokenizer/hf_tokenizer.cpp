// Encoding and decoding with a tokenizer.json's byte-level BPE (the order is in hf_tokenizer.h).
#include "tokenizer/hf_tokenizer.h"

#include <algorithm>

#include "fsdp/error.h"
#include "tokenizer/unicode_text.h"

namespace fsdp::tokenizer {

void AddedTokenMatcher::add(std::string content, uint32_t id) {
  FSDP_CHECK(!content.empty(), "an added token is empty");
  tokens_.emplace_back(std::move(content), id);
}

void AddedTokenMatcher::finish() {
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const std::string& t = tokens_[k].first;
    Bucket& b = by_first_byte_[static_cast<unsigned char>(t[0])];
    b.tokens.emplace(std::string_view(t), static_cast<uint32_t>(k));
    b.lengths.push_back(t.size());
  }
  for (Bucket& b : by_first_byte_) {
    std::sort(b.lengths.begin(), b.lengths.end(), std::greater<size_t>());
    b.lengths.erase(std::unique(b.lengths.begin(), b.lengths.end()), b.lengths.end());
  }
}

int64_t AddedTokenMatcher::longest_at(std::string_view text, size_t i) const {
  const Bucket& b = by_first_byte_[static_cast<unsigned char>(text[i])];
  for (size_t n : b.lengths) {
    if (n > text.size() - i) continue;
    if (const auto it = b.tokens.find(text.substr(i, n)); it != b.tokens.end()) return it->second;
  }
  return -1;
}

void HfTokenizer::pre_tokenize(std::string_view text, size_t level, RegexSplit::Scratch& scratch,
                               ByteLevelBpe::Cache& cache, std::vector<uint32_t>& out) const {
  if (level == p_.splits.size()) return cache.encode(p_.bpe, text, out);
  p_.splits[level]->split(text, scratch, [&](std::string_view piece) {
    pre_tokenize(piece, level + 1, scratch, cache, out);
  });
}

std::vector<uint32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const size_t bad = invalid_utf8_offset(text);
  if (bad != std::string_view::npos)
    FSDP_USER_FAIL(p_.name, ": the text is not UTF-8: byte ", bad, " (0x", std::hex,
                   static_cast<int>(static_cast<unsigned char>(text[bad])), std::dec,
                   ") starts no character");
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + p_.prefix.size() + p_.suffix.size());
  if (add_special_tokens) out.insert(out.end(), p_.prefix.begin(), p_.prefix.end());
  ByteLevelBpe::Cache cache;
  RegexSplit::Scratch scratch;
  p_.raw_added.split(text, [&](std::string_view raw, int64_t id) {
    if (id >= 0) return out.push_back(static_cast<uint32_t>(id));
    std::string normalized;
    std::string_view segment = raw;
    if (p_.nfc && !is_ascii(raw)) segment = normalized = nfc(raw);
    p_.normalized_added.split(segment, [&](std::string_view piece, int64_t nid) {
      if (nid >= 0) return out.push_back(static_cast<uint32_t>(nid));
      pre_tokenize(piece, 0, scratch, cache, out);
    });
  });
  if (add_special_tokens) out.insert(out.end(), p_.suffix.begin(), p_.suffix.end());
  return out;
}

std::string HfTokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  std::string out;
  for (uint32_t id : ids) {
    FSDP_USER_CHECK(id < p_.decoded.size(), p_.name, ": id ", id, " is outside the vocabulary of ",
                    p_.decoded.size(), " tokens");
    if (skip_special_tokens && p_.special[id]) continue;
    out += p_.decoded[id];
  }
  return out;
}

std::optional<uint32_t> HfTokenizer::token_to_id(std::string_view token) const {
  if (const auto it = p_.added_ids.find(std::string(token)); it != p_.added_ids.end())
    return it->second;
  if (const int64_t id = p_.bpe.find(token); id >= 0) return static_cast<uint32_t>(id);
  if (const auto it = p_.other_vocab.find(std::string(token)); it != p_.other_vocab.end())
    return it->second;
  return std::nullopt;
}

}  // namespace fsdp::tokenizer
