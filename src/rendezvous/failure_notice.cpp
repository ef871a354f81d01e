// See Note [Failure notices] in failure_notice.h.
#include "rendezvous/failure_notice.h"

#include <chrono>
#include <exception>
#include <thread>

namespace fsdp::rendezvous {

namespace {
const char* const kCountKey = "fsdp/failure/count";
const char* const kNoticeKey = "fsdp/failure/notice";
}  // namespace

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
    const std::string text = store.get(kNoticeKey, Millis(1000));
    const size_t newline = text.find('\n');
    FailureNotice notice;
    notice.rank = std::stoi(text.substr(0, newline));
    notice.message = newline == std::string::npos ? "" : text.substr(newline + 1);
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
