// Note [Failure notices]
// When a rank of a multi-process job fails, the others learn of it as a broken connection or
// a timeout deep inside a collective, which says nothing about who failed or why. So whoever
// first sees a failure with its cause in hand writes one notice into the job's store: a rank
// whose body threw (its message), or a launcher that reaped a child ("rank 2 was killed by
// signal 9"). Only the first notice is kept. A rank whose collective breaks reads the notice
// (waiting a little for it, since the launcher may be a moment behind the broken socket) and
// names the lost rank and its cause in its own error. Under torchrun, srun or mpirun no
// launcher of ours reaps a rank that dies by a signal; there each rank arms its connection to
// our store's server with a notice of its own death (post_failure_on_disconnect), which the
// server posts when that connection closes before the rank said goodbye.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "rendezvous/store.h"
#include "rendezvous/tcp_store.h"

namespace fsdp::rendezvous {

struct FailureNotice {
  int rank = -1;        // the global rank that failed
  std::string message;  // e.g. "rank 2 was killed by signal 9"
};

// Records `notice` unless one was recorded before; returns true if this one was kept.
bool post_failure(Store& store, const FailureNotice& notice);
// Arms `store`'s connection (our server only): posts `notice` should the connection close
// before `store` is destroyed, under `prefix` (that of the PrefixStore the ranks post and
// read notices through, with its "/"; "" for none). Throws if the store is unreachable.
void post_failure_on_disconnect(TcpStore& store, const std::string& prefix,
                                const FailureNotice& notice);
// The recorded notice, waiting up to `wait` for one to appear; nullopt if none by then (or
// if what is there is not a notice). Its message is safe to print, whoever wrote it into the
// store: one_safe_line(..., kMaxNoticeBytes), attributed_to(its rank, ...).
std::optional<FailureNotice> read_failure(Store& store, Millis wait);

inline constexpr size_t kMaxNoticeBytes = 2000;
// `text` as one line of at most `max_bytes` (then cut, ending " [...]"): control characters
// (C0, DEL, C1, line separators, bidirectional overrides) become spaces, bytes that are not
// UTF-8 become '?'.
std::string one_safe_line(const std::string& text, size_t max_bytes);
// `text` as said by rank `rank`: as it is when it starts "rank <rank>" (then a space, a
// comma, a colon or its end), else with "rank <rank>: " in front.
std::string attributed_to(int rank, const std::string& text);

// Whether the store still answers (a lost connection to it means its host is gone).
bool store_answers(Store& store);

}  // namespace fsdp::rendezvous
