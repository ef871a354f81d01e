// Note [Collective fingerprints]
// with_collective_checks (include/fsdp/collective_check.h) wraps a communicator. Before it
// passes a collective on, every member all-gathers a fixed-size fingerprint of it over the
// same communicator, copies the gathered fingerprints to the host, waits for them, and
// compares: the first member whose fingerprint differs from member 0's is named beside member
// 0 in an fsdp::Error that every member raises alike (they all compare the same bytes).
//
// Why an all-gather on the communicator itself, and not the rendezvous store:
//  - It works on every backend with nothing more than the Comm and Device interfaces (NCCL,
//    the CPU threads, processes), including under an external launcher where no store of
//    ours may exist.
//  - The exchanges pair up exactly: each rank issues one fingerprint all-gather per
//    collective, all of the same shape, so the k-th exchange of every rank meets the k-th
//    of the others, and the fingerprint says what each rank meant to issue as its k-th.
//  - A store lives on rank 0: N members would make N * N requests there per collective, and
//    its keys could never be deleted (the store has no delete).
// What it costs (so it is a debug mode, off by default): per collective, one all-gather of 64
// bytes per member, a 64-byte upload, a copy to the host and a synchronization of the issuing
// stream, so the host waits for everything queued before the collective on that stream and
// communication no longer overlaps the host's issuing; memory: 64 * (members + 1) bytes of
// device memory and 64 * members of host memory per communicator, allocated on first use.
// Results do not change: the real collectives run as before, on the same streams, and
// Comm::issued on the wrapper counts only them (the exchanges go through the wrapped
// communicator, which nobody else sees). A trace does show the exchanges, as collectives
// under the label of the collective they check.
// Not compared: all_to_all's per-peer counts (legitimately uneven; every backend checks the
// pairs itself), so its fingerprint is op and dtype only.
#include "fsdp/collective_check.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/error.h"

namespace fsdp {

namespace {

enum class CheckedOp : int32_t { AllGather, ReduceScatter, AllReduce, Broadcast, AllToAll, Split };

const char* checked_op_name(CheckedOp op) {
  switch (op) {
    case CheckedOp::AllGather: return "all_gather";
    case CheckedOp::ReduceScatter: return "reduce_scatter";
    case CheckedOp::AllReduce: return "all_reduce";
    case CheckedOp::Broadcast: return "broadcast";
    case CheckedOp::AllToAll: return "all_to_all";
    case CheckedOp::Split: return "split";
  }
  return "?";
}

constexpr size_t kNameChars = 24;

// 64 bytes, all 32-bit words, so it travels as DType::I32 on every backend.
struct Fingerprint {
  int64_t seq = 0;
  int32_t op = 0;
  int32_t dtype = 0;
  int32_t reduce = -1;  // reductions only
  int32_t root = -1;    // broadcast only
  int64_t bytes = 0;    // what this rank contributes (send buffer); not compared for all_to_all
  uint64_t name_hash = 0;
  char name[kNameChars] = {};  // the communicator's name, cut to fit (for the message)
};
static_assert(sizeof(Fingerprint) == 64, "fingerprints travel as 16 int32 words");
constexpr int64_t kFingerprintWords = sizeof(Fingerprint) / sizeof(int32_t);

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool same(const Fingerprint& a, const Fingerprint& b) {
  if (a.seq != b.seq || a.op != b.op || a.dtype != b.dtype || a.name_hash != b.name_hash)
    return false;
  if (static_cast<CheckedOp>(a.op) == CheckedOp::AllToAll) return true;
  return a.bytes == b.bytes && a.reduce == b.reduce && a.root == b.root;
}

// "reduce_scatter (sum) of 8192 bytes (fp32)", "broadcast from root 1 of 64 bytes (bf16)".
std::string describe(const Fingerprint& f) {
  const CheckedOp op = static_cast<CheckedOp>(f.op);
  std::string out = checked_op_name(op);
  if (op == CheckedOp::Split) return out;
  if (f.reduce >= 0) out += detail::concat(" (", reduce_op_name(static_cast<ReduceOp>(f.reduce)), ")");
  if (op == CheckedOp::Broadcast) out += detail::concat(" from root ", f.root);
  out += detail::concat(" of ", f.bytes, " bytes (", dtype_name(static_cast<DType>(f.dtype)), ")");
  return out;
}

std::string name_of(const Fingerprint& f) {
  return std::string(f.name, strnlen(f.name, kNameChars));
}

class CheckedComm final : public Comm {
 public:
  CheckedComm(std::shared_ptr<Comm> inner, Device& device)
      : Comm(inner->rank(), inner->world_ranks(), inner->name()),
        inner_(std::move(inner)),
        device_(device),
        name_hash_(fnv1a(name())) {}

  ~CheckedComm() override {
    if (send_) device_.free(send_, last_stream_);  // stream-ordered: safe whatever is queued
    if (recv_) device_.free(recv_, last_stream_);
    if (host_ && copy_may_be_queued_ && !wait_for_copy()) return;  // leaked, not freed under it
    if (host_) device_.free_host(host_);
    if (copied_.valid()) device_.destroy_event(copied_);
  }

 protected:
  void do_all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) override {
    check(make(CheckedOp::AllGather, t, count * dtype_size(t)), s);
    inner_->all_gather(send, recv, count, t, s);
  }
  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                         Stream s) override {
    Fingerprint f = make(CheckedOp::ReduceScatter, t, size() * count * dtype_size(t));
    f.reduce = static_cast<int32_t>(op);
    check(f, s);
    inner_->reduce_scatter(send, recv, count, t, op, s);
  }
  void do_all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                     Stream s) override {
    Fingerprint f = make(CheckedOp::AllReduce, t, count * dtype_size(t));
    f.reduce = static_cast<int32_t>(op);
    check(f, s);
    inner_->all_reduce(send, recv, count, t, op, s);
  }
  void do_broadcast(void* buf, int64_t count, DType t, int root, Stream s) override {
    Fingerprint f = make(CheckedOp::Broadcast, t, count * dtype_size(t));
    f.root = root;
    check(f, s);
    inner_->broadcast(buf, count, t, root, s);
  }
  void do_all_to_all(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                     const std::vector<int64_t>& recv_counts, DType t, Stream s) override {
    int64_t sent = 0;
    for (int64_t n : send_counts) sent += n;
    check(make(CheckedOp::AllToAll, t, sent * dtype_size(t)), s);
    inner_->all_to_all(send, send_counts, recv, recv_counts, t, s);
  }
  // Split takes no stream: the exchange runs on the stream of the last checked collective,
  // or, before the first, on a stream of the check's own (made only then).
  std::unique_ptr<Comm> do_split(int color, int key, const std::string& name) override {
    check_split();
    return wrap(inner_->split(color, key, name));
  }
  std::unique_ptr<Comm> do_split_groups(int group_size, int stride, int,
                                        const std::string& name) override {
    check_split();
    return wrap(inner_->split_groups(group_size, stride, name));
  }

 private:
  void check_split() {
    if (!last_stream_.valid())
      last_stream_ = device_.create_stream("collective-check", StreamPriority::Normal);
    check(make(CheckedOp::Split, DType::I32, 0), last_stream_);
  }
  std::unique_ptr<Comm> wrap(std::unique_ptr<Comm> child) {
    if (!child) return nullptr;
    return std::make_unique<CheckedComm>(std::shared_ptr<Comm>(std::move(child)), device_);
  }

  Fingerprint make(CheckedOp op, DType t, int64_t bytes) {
    Fingerprint f;
    f.seq = next_seq_++;
    f.op = static_cast<int32_t>(op);
    f.dtype = static_cast<int32_t>(t);
    f.bytes = bytes;
    f.name_hash = name_hash_;
    std::memcpy(f.name, name().data(), std::min(name().size(), kNameChars));
    return f;
  }

  // Exchanges `mine` with every member on stream `s` and throws on any difference.
  void check(const Fingerprint& mine, Stream s) {
    const size_t n = static_cast<size_t>(size());
    if (!send_) {
      send_ = device_.alloc(sizeof(Fingerprint), s, MemTag::Other);
      recv_ = device_.alloc(n * sizeof(Fingerprint), s, MemTag::Other);
      host_ = device_.alloc_host(n * sizeof(Fingerprint));
      copied_ = device_.create_event();
    }
    last_stream_ = s;
    std::vector<Fingerprint> all(n);
    try {
      device_.copy_from_host(s, send_, &mine, sizeof(Fingerprint));
      inner_->all_gather(send_, recv_, kFingerprintWords, DType::I32, s);
      device_.copy_to_host(s, host_, recv_, n * sizeof(Fingerprint));
      device_.record_event(copied_, s);
      copy_may_be_queued_ = true;
      device_.synchronize_stream(s);
      copy_may_be_queued_ = false;
    } catch (const Error& e) {
      FSDP_FAIL("checking collective ", mine.seq, " on '", name(), "' (", describe(mine),
                "): the fingerprint exchange failed: ", e.what());
    }
    std::memcpy(all.data(), host_, n * sizeof(Fingerprint));
    for (size_t m = 1; m < n; ++m) {
      if (same(all[0], all[m])) continue;
      drain_before_failing();
      const int r0 = world_ranks()[0], rm = world_ranks()[m];
      std::string where = detail::concat("collective ", mine.seq, " on '", name(), "'");
      if (all[0].seq != all[m].seq)
        FSDP_FAIL(where, ": rank ", r0, " is at its collective ", all[0].seq, ", rank ", rm,
                  " at ", all[m].seq, " (some collectives bypassed the check)");
      if (all[0].name_hash != all[m].name_hash)
        FSDP_FAIL(where, ": rank ", r0, " issued ", describe(all[0]), " on '", name_of(all[0]),
                  "', rank ", rm, " issued ", describe(all[m]), " on '", name_of(all[m]), "'");
      FSDP_FAIL(where, ": rank ", r0, " issued ", describe(all[0]), ", rank ", rm, " issued ",
                describe(all[m]), "; every rank must issue the same collectives in the same "
                "order on a communicator");
    }
  }

  // The error unwinds the caller's step, freeing what queued work may still use: let that
  // work finish first. Everything queued was issued before this collective, so it needs no
  // collective that the mismatch would leave unmatched; a failure in it is beside the point.
  void drain_before_failing() {
    try {
      device_.synchronize();
    } catch (const Error&) {
    }
  }

  // After a failed synchronization (an aborted world gives up waiting at once) the copy into
  // host_ may still be queued or running: polls its event, which every backend completes
  // when its stream drains, for up to a minute. False if it never came (host_ must leak).
  bool wait_for_copy() noexcept {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    try {
      while (!device_.query_event(copied_)) {
        if (std::chrono::steady_clock::now() > give_up) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      return true;
    } catch (...) {
      return false;
    }
  }

  std::shared_ptr<Comm> inner_;
  Device& device_;
  const uint64_t name_hash_;
  int64_t next_seq_ = 0;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  void* host_ = nullptr;
  Event copied_;  // recorded after each copy into host_
  bool copy_may_be_queued_ = false;
  Stream last_stream_;
};

}  // namespace

std::shared_ptr<Comm> with_collective_checks(std::shared_ptr<Comm> comm, Device& device) {
  FSDP_CHECK(comm != nullptr, "with_collective_checks needs a communicator");
  return std::make_shared<CheckedComm>(std::move(comm), device);
}

}  // namespace fsdp
