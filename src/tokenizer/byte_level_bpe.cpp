// Byte-level BPE (Note [Byte-level BPE] in byte_level_bpe.h).
#include "tokenizer/byte_level_bpe.h"

#include <queue>

#include "fsdp/error.h"

namespace fsdp::tokenizer {

namespace {

// Bytes that stand for themselves in GPT-2's map; the rest take U+0100 onwards, in order.
bool printable(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
}

struct ByteMap {
  std::array<uint32_t, 256> to_codepoint{};
  std::array<int16_t, 324> to_byte{};  // code points 0..323 cover every mapped character
  ByteMap() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      to_codepoint[b] = printable(b) ? static_cast<uint32_t>(b) : next++;
      to_byte[to_codepoint[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {  // every mapped character is below U+0800: two bytes
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

uint32_t byte_to_codepoint(unsigned char b) {
  return byte_map().to_codepoint[b];
}

bool byte_level_to_bytes(std::string_view token, std::string& bytes) {
  const ByteMap& map = byte_map();
  bytes.clear();
  for (size_t i = 0; i < token.size();) {
    const auto c0 = static_cast<unsigned char>(token[i]);
    uint32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((c0 & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // three or four bytes: above U+07FF, no byte maps there
    }
    if (cp >= map.to_byte.size() || map.to_byte[cp] < 0) return false;
    bytes += static_cast<char>(map.to_byte[cp]);
  }
  return true;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  for (char c : bytes) append_utf8(byte_to_codepoint(static_cast<unsigned char>(c)), out);
  return out;
}

void ByteLevelBpe::add_token(std::string bytes, uint32_t id) {
  ids_.emplace(std::move(bytes), id);
}

void ByteLevelBpe::add_merge(uint32_t left, uint32_t right, uint32_t merged, uint32_t rank) {
  merges_[(uint64_t{left} << 32) | right] = {rank, merged};
}

bool ByteLevelBpe::finish(int& missing_byte) {
  for (int b = 0; b < 256; ++b) {
    const int64_t id = find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (id < 0) {
      missing_byte = b;
      return false;
    }
    byte_ids_[b] = static_cast<uint32_t>(id);
  }
  return true;
}

int64_t ByteLevelBpe::find(std::string_view bytes) const {
  const auto it = ids_.find(std::string(bytes));
  return it == ids_.end() ? int64_t{-1} : static_cast<int64_t>(it->second);
}

const ByteLevelBpe::MergeTarget* ByteLevelBpe::merge_of(uint32_t left, uint32_t right) const {
  const auto it = merges_.find((uint64_t{left} << 32) | right);
  return it == merges_.end() ? nullptr : &it->second;
}

void ByteLevelBpe::encode_word(std::string_view word, std::vector<uint32_t>& out) const {
  if (ignore_merges_) {
    if (const int64_t id = find(word); id >= 0) {
      out.push_back(static_cast<uint32_t>(id));
      return;
    }
  }
  // Symbols in a doubly linked list over the word's bytes; `alive` false once merged away.
  struct Symbol {
    uint32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> s(word.size());
  for (size_t i = 0; i < word.size(); ++i)
    s[i] = {byte_ids_[static_cast<unsigned char>(word[i])], static_cast<int32_t>(i) - 1,
            i + 1 < word.size() ? static_cast<int32_t>(i + 1) : -1, true};
  // Candidate merges, lowest rank first, then leftmost. An entry goes stale when either side
  // has changed since it was pushed; a changed pair always spells a longer string, so it
  // cannot map to the same merged token, and the check below catches it.
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    uint32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push = [&](int32_t pos) {
    const int32_t next = s[pos].next;
    if (next < 0) return;
    if (const MergeTarget* m = merge_of(s[pos].id, s[next].id))
      queue.push({m->rank, pos, m->merged});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(word.size()); ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = s[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = s[left.next];
    const MergeTarget* m = merge_of(left.id, right.id);
    if (m == nullptr || m->merged != top.merged) continue;  // stale
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) s[right.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (const Symbol& sym : s)
    if (sym.alive) out.push_back(sym.id);
}

void ByteLevelBpe::Cache::encode(const ByteLevelBpe& bpe, std::string_view word,
                                 std::vector<uint32_t>& out) {
  if (word.size() > kMaxCachedWordBytes) return bpe.encode_word(word, out);
  std::string key(word);
  if (const auto it = words_.find(key); it != words_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t first = out.size();
  bpe.encode_word(word, out);
  if (words_.size() >= kMaxEntries) words_.clear();  // bounded: start over
  words_.emplace(std::move(key), std::vector<uint32_t>(out.begin() + first, out.end()));
}

}  // namespace fsdp::tokenizer
