// See Note [Failure notices] in failure_notice.h.
#include "rendezvous/failure_notice.h"

#include <chrono>
#include <cstdint>
#include <exception>
#include <thread>

namespace fsdp::rendezvous {

namespace {
const char* const kCountKey = "fsdp/failure/count";
const char* const kNoticeKey = "fsdp/failure/notice";

// The length of the UTF-8 sequence at s[i] and its code point, or 0 when it is not one.
size_t utf8_at(const std::string& s, size_t i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t lead = b(i);
  const size_t n = lead >= 0xF5 ? 0 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  cp = lead & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// Characters that would break the line or reorder what a terminal shows.
bool unsafe(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

// The rank of a notice's first line: digits alone, or nullopt.
std::optional<int> rank_of(const std::string& text) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoi(text);
}
}  // namespace

std::string one_safe_line(const std::string& text, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = static_cast<uint8_t>(text[i]);
    size_t n = cp < 0x80 ? 1 : utf8_at(text, i, cp);
    std::string piece = n == 0 ? "?" : unsafe(cp) ? " " : text.substr(i, n);
    i += n == 0 ? 1 : n;
    if (out.size() + piece.size() > max_bytes) {
      out += " [...]";
      break;
    }
    out += piece;
  }
  return out;
}

std::string attributed_to(int rank, const std::string& text) {
  const std::string name = "rank " + std::to_string(rank);
  const bool named = text.compare(0, name.size(), name) == 0 &&
                     (text.size() == name.size() || std::string(" ,:").find(text[name.size()]) !=
                                                        std::string::npos);
  return named ? text : name + ": " + text;
}

bool post_failure(Store& store, const FailureNotice& notice) {
  try {
    if (store.add(kCountKey, 1) != 1) return false;
    store.set(kNoticeKey, std::to_string(notice.rank) + "\n" + notice.message);
    // A set has no reply; a request that has one, behind it, makes sure the store holds the
    // notice before the caller (often a process about to exit) goes on.
    store.check({kNoticeKey});
    return true;
  } catch (const std::exception&) {
    return false;  // the store itself is gone: nobody is left to read the notice
  }
}

void post_failure_on_disconnect(TcpStore& store, const std::string& prefix,
                                const FailureNotice& notice) {
  store.set_disconnect_notice(prefix + kCountKey, prefix + kNoticeKey,
                              std::to_string(notice.rank) + "\n" + notice.message);
}

std::optional<FailureNotice> read_failure(Store& store, Millis wait) {
  try {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    // The notice follows its count closely; poll for it until `wait` is over.
    for (;;) {
      if (store.check({kNoticeKey})[0]) break;
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // Whoever wrote it, it reaches the user: one line of bounded length, no control
    // characters, and attributed to the rank it names.
    const std::string text = store.get(kNoticeKey, Millis(1000));
    const size_t newline = text.find('\n');
    const std::optional<int> rank = rank_of(text.substr(0, newline));
    if (!rank || newline == std::string::npos) return std::nullopt;
    FailureNotice notice;
    notice.rank = *rank;
    notice.message = attributed_to(*rank, one_safe_line(text.substr(newline + 1), kMaxNoticeBytes));
    return notice;
  } catch (const std::exception&) {
    return std::nullopt;  // the store is unreachable: its host is gone too
  }
}

bool store_answers(Store& store) {
  try {
    store.check({kNoticeKey});
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace fsdp::rendezvous
