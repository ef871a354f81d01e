// Note [CPU collectives]
// Ranks share one address space, so a collective is a rendezvous rather than a message
// exchange: every member deposits its call (kind, count, dtype, op, buffers) in the
// communicator's shared state, and once all have arrived each member computes its own output
// by reading its peers' buffers directly.
//
//  - Ordering. The host assigns each collective a sequence number per communicator when it
//    is issued; the stream task for number n first waits until number n - 1 finished on this
//    rank. So a communicator runs one collective at a time in issue order even when they are
//    issued on different streams, as NCCL does, while different communicators progress
//    independently.
//  - Checking. When all members of (communicator, n) have arrived, each compares the calls;
//    any difference is the "same collectives in the same order" violation (docs/design.md,
//    invariant 4) and every member raises the same fsdp::Error, instead of the silent hang or
//    corruption it would cause on NCCL.
//  - Phases. arrive -> read peers' buffers -> depart -> write what others might still have
//    been reading. The departure barrier keeps every send buffer valid and unchanged until
//    all members have read it; results that could land on a buffer a peer reads (all_reduce
//    in place) are built in a private fp32 buffer and written only after it.
//  - Giving up. Only the waits before the exchange can be cancelled (abort, or a failure on
//    the member's device) or time out (CpuOptions::collective_timeout_s, wall time: so no
//    test hangs on a cross-communicator deadlock or a rank that never issues a collective;
//    the error names the communicator, the sequence number and the ranks that have not
//    arrived). A member that gives up marks the rendezvous abandoned while it
//    still holds the lock that saw it incomplete, so the others fail too rather than read
//    buffers that may be freed next; the departure wait is not cancellable, and needs not
//    be, since every member that got past arrival reaches departure without blocking.
//  - Time. A collective's timeline interval runs from its turn on the communicator to its
//    departure. With the simulated link, the members leave link time after the last arrival
//    (simulated under Note [Virtual clock]).
//  - Reductions add in member order 0..n-1 in fp32 and round to the dtype once, so every rank
//    gets bit-identical results, whatever the timing (chaos mode checks this).
//  - split() is collective over the parent and uses the same rendezvous, on the host thread
//    (it takes no stream); the first member of each color to get there creates the child's
//    shared state and the others of that color join it.
#include "backend/cpu/cpu_comm.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <optional>
#include <exception>
#include <functional>
#include <utility>

#include "backend/cpu/cpu_dtype_io.h"
#include "backend/cpu/cpu_stream.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

namespace {

const char* op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::AllGather:
      return "all_gather";
    case CollectiveOp::ReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::AllReduce:
      return "all_reduce";
    case CollectiveOp::Broadcast:
      return "broadcast";
    case CollectiveOp::AllToAll:
      return "all_to_all";
    case CollectiveOp::Split:
      return "split";
  }
  return "?";
}

bool is_reduction(CollectiveOp op) {
  return op == CollectiveOp::ReduceScatter || op == CollectiveOp::AllReduce;
}

std::string describe(const CollectiveCall& c) {
  if (c.op == CollectiveOp::Split) return "split";
  if (c.op == CollectiveOp::AllToAll) return detail::concat("all_to_all(", dtype_name(c.dtype), ")");
  std::string out = detail::concat(op_name(c.op), "(count=", c.count, ", ", dtype_name(c.dtype));
  if (is_reduction(c.op)) out += detail::concat(", ", reduce_op_name(c.reduce));
  if (c.op == CollectiveOp::Broadcast) out += detail::concat(", root=", c.root);
  return out + ")";
}

bool same_collective(const CollectiveCall& a, const CollectiveCall& b) {
  if (a.op != b.op) return false;
  if (a.op == CollectiveOp::Split) return true;
  if (a.op == CollectiveOp::AllToAll) return a.dtype == b.dtype;
  if (a.count != b.count || a.dtype != b.dtype) return false;
  if (is_reduction(a.op) && a.reduce != b.reduce) return false;
  if (a.op == CollectiveOp::Broadcast && a.root != b.root) return false;
  return true;
}

// Empty when every member issued the same collective.
std::string describe_mismatch(const CommShared& shared, int64_t seq,
                              const std::vector<CollectiveCall>& calls) {
  for (int m = 1; m < shared.size(); ++m) {
    if (same_collective(calls[0], calls[m])) continue;
    return detail::concat(
        "collective mismatch on communicator '", shared.name, "' at its collective #", seq,
        ": member 0 (rank ", shared.world_ranks[0], ") issued ", describe(calls[0]), " but member ",
        m, " (rank ", shared.world_ranks[m], ") issued ", describe(calls[m]),
        "; every rank must issue the same collectives in the same order on a communicator");
  }
  if (calls[0].op == CollectiveOp::AllToAll)
    for (int m = 0; m < shared.size(); ++m)
      for (int j = 0; j < shared.size(); ++j)
        if (calls[m].send_counts[j] != calls[j].recv_counts[m])
          return detail::concat("all_to_all on communicator '", shared.name, "' at its collective #",
                                seq, ": member ", m, " (rank ", shared.world_ranks[m], ") sends ",
                                calls[m].send_counts[j], " elements to member ", j, " (rank ",
                                shared.world_ranks[j], "), which expects ",
                                calls[j].recv_counts[m]);
  return {};
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i == 0 ? "" : (i + 1 == ranks.size() ? " and " : ", ")) + std::to_string(ranks[i]);
  return out;
}

// The error of a collective that waited past the communicator's timeout. `blocking` is the
// collective this rank is stuck on: seq itself, or an earlier one on this rank that has not
// finished. Caller holds shared.mutex.
std::string timeout_message(const CommShared& shared, int member, int64_t seq,
                            const CollectiveCall& call) {
  const int64_t blocking = shared.finished[member];
  const auto it = shared.open.find(blocking);
  std::vector<int> missing;
  for (int m = 0; m < shared.size(); ++m)
    if (it == shared.open.end() || !it->second->present[m]) missing.push_back(shared.world_ranks[m]);
  std::string out = detail::concat(op_name(call.op), " #", seq, " on communicator '", shared.name,
                                   "' timed out after ", shared.timeout_s, " s: ");
  if (blocking != seq)
    out += detail::concat("this rank's collective #", blocking, " on it has not finished, and ");
  out += detail::concat(missing.size() == 1 ? "rank " : "ranks ", rank_list(missing),
                        missing.size() == 1 ? " has" : " have", " not arrived at #", blocking,
                        " (ranks issuing collectives in different orders, or a rank that "
                        "never issues it)");
  return out;
}

// The rendezvous protocol of Note [CPU collectives]. `exchange` runs once all members have
// arrived and may read their buffers; `finish` runs after all have departed.
void run_collective(CommShared& shared, int member, int64_t seq, const CollectiveCall& call,
                    const Cancellation& cancel, const std::function<void(Rendezvous&)>& exchange,
                    const std::function<void()>& finish) {
  const int size = shared.size();
  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (shared.timeout_s > 0)
    deadline = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(shared.timeout_s));
  std::unique_lock<std::mutex> lock(shared.mutex);
  if (!shared.cv.wait(lock, &cancel, [&] { return shared.finished[member] == seq; }, deadline))
    FSDP_FAIL(timeout_message(shared, member, seq, call));
  lock.unlock();
  restart_task_clock();  // queueing behind the previous collective is not collective time
  chaos_pause_on_this_thread();

  lock.lock();
  std::shared_ptr<Rendezvous>& entry = shared.open[seq];
  if (!entry) entry = std::make_shared<Rendezvous>(size);
  const std::shared_ptr<Rendezvous> rv = entry;
  rv->calls[member] = call;
  rv->present[member] = true;
  ++rv->arrived;
  shared.cv.notify_all();
  // Giving up, still under the lock that saw arrived < size: no member has started reading.
  auto abandon = [&](std::string reason) {
    rv->abandoned = true;
    rv->abandoned_by = member;
    rv->abandon_reason = std::move(reason);
    shared.finished[member] = seq + 1;
    shared.cv.notify_all();
  };
  bool all_arrived;
  try {
    all_arrived = shared.cv.wait(
        lock, &cancel, [&] { return rv->arrived == size || rv->abandoned; }, deadline);
  } catch (...) {
    abandon("it was aborted or failed");
    throw;
  }
  if (!all_arrived) {
    const std::string message = timeout_message(shared, member, seq, call);
    abandon(message);
    FSDP_FAIL(message);
  }
  if (rv->abandoned) {
    shared.finished[member] = seq + 1;
    shared.cv.notify_all();
    FSDP_FAIL(op_name(call.op), " #", seq, " on communicator '", shared.name,
              "' abandoned: member ", rv->abandoned_by, " (rank ",
              shared.world_ranks[rv->abandoned_by], ") gave up waiting: ", rv->abandon_reason);
  }
  const std::string mismatch = describe_mismatch(shared, seq, rv->calls);
  if (!mismatch.empty()) {
    // Every member sees the same calls and fails alike; none touches a buffer.
    shared.open.erase(seq);
    shared.finished[member] = seq + 1;
    shared.cv.notify_all();
    FSDP_FAIL(mismatch);
  }
  lock.unlock();

  std::exception_ptr failure;
  try {
    exchange(*rv);
  } catch (...) {
    failure = std::current_exception();  // still depart, so that the others can finish
  }
  chaos_pause_on_this_thread();

  lock.lock();
  ++rv->departed;
  shared.cv.notify_all();
  // Not cancellable: once all have arrived, every member reaches this point without
  // blocking, and leaving early would let a peer's buffers go while others still read them.
  shared.cv.wait(lock, nullptr, [&] { return rv->departed == size; });
  shared.open.erase(seq);  // all arrived, so nobody looks it up again
  lock.unlock();

  if (!failure) finish();
  stop_task_clock();
  lock.lock();
  shared.finished[member] = seq + 1;
  shared.cv.notify_all();
  lock.unlock();
  if (failure) std::rethrow_exception(failure);
}

// Sum (or mean) over members of `count` elements starting at element `first` of each
// member's send buffer, in member order, in fp32.
std::vector<float> reduce_in_member_order(const std::vector<CollectiveCall>& calls, int64_t first,
                                          int64_t count, DType t, ReduceOp op) {
  std::vector<float> acc(static_cast<size_t>(count), op == ReduceOp::Max ? -INFINITY : 0.0f);
  with_io(t, [&](auto in) {
    for (const CollectiveCall& c : calls)
      for (int64_t e = 0; e < count; ++e) {
        float& a = acc[static_cast<size_t>(e)];
        const float v = in.load(c.send, first + e);
        a = op != ReduceOp::Max ? a + v : (std::isnan(a) || std::isnan(v)) ? NAN : std::max(a, v);
      }
  });
  if (op == ReduceOp::Avg) {
    const float n = static_cast<float>(calls.size());
    for (float& v : acc) v /= n;
  }
  return acc;
}

// Runs a data collective (not split) for one member, on its stream's worker thread.
void execute(CommShared& shared, int member, int64_t seq, const CollectiveCall& call,
             const WorldState& world, const Cancellation& cancel) {
  const size_t chunk_bytes = static_cast<size_t>(call.count) * dtype_size(call.dtype);
  std::vector<float> reduced;  // reductions: this member's result, written in `finish`
  auto exchange = [&](Rendezvous& rv) {
    // The simulated link: what this rank receives, at link_gbps. The data lands at the end of
    // the transfer, so a buffer freed or reused during it is read or written late, as on a
    // real link (on the virtual clock, certainly so).
    if (shared.link_gbps > 0) {
      const double peers = shared.size() - 1;
      int64_t from_peers = 0;  // all_to_all: what the others send us
      for (int j = 0; j < static_cast<int>(call.recv_counts.size()); ++j)
        if (j != member) from_peers += call.recv_counts[j];
      const double bytes = call.op == CollectiveOp::AllToAll
                               ? static_cast<double>(from_peers * dtype_size(call.dtype))
                           : call.op == CollectiveOp::AllReduce ? 2.0 * peers * chunk_bytes / shared.size()
                           : call.op == CollectiveOp::Broadcast ? chunk_bytes : peers * chunk_bytes;
      world.pass_time(bytes / (shared.link_gbps * 1e3), &cancel);
    }
    switch (call.op) {
      case CollectiveOp::AllGather:
        for (int j = 0; j < shared.size(); ++j) {
          char* dst = static_cast<char*>(call.recv) + j * chunk_bytes;
          // In place, our own chunk already sits where it belongs.
          if (chunk_bytes && rv.calls[j].send != dst) std::memmove(dst, rv.calls[j].send, chunk_bytes);
        }
        break;
      case CollectiveOp::ReduceScatter:
        reduced = reduce_in_member_order(rv.calls, member * call.count, call.count, call.dtype,
                                         call.reduce);
        break;
      case CollectiveOp::AllReduce:
        reduced = reduce_in_member_order(rv.calls, 0, call.count, call.dtype, call.reduce);
        break;
      case CollectiveOp::Broadcast:
        // Only non-roots write, and only their own buffer: safe before departure.
        if (member != call.root && chunk_bytes)
          std::memcpy(call.recv, rv.calls[call.root].send, chunk_bytes);
        break;
      case CollectiveOp::AllToAll: {
        // Only our own recv is written, and no peer reads it: safe before departure.
        const size_t elem = dtype_size(call.dtype);
        char* dst = static_cast<char*>(call.recv);
        for (int j = 0; j < shared.size(); ++j) {
          const CollectiveCall& peer = rv.calls[j];
          int64_t offset = 0;  // where peer j's chunk for us starts in its send buffer
          for (int m = 0; m < member; ++m) offset += peer.send_counts[m];
          const size_t bytes = static_cast<size_t>(call.recv_counts[j]) * elem;
          if (bytes) std::memcpy(dst, static_cast<const char*>(peer.send) + offset * elem, bytes);
          dst += bytes;
        }
        break;
      }
      case CollectiveOp::Split:
        FSDP_FAIL("split is not a stream collective");
    }
  };
  auto finish = [&] {
    if (!is_reduction(call.op)) return;
    with_io(call.dtype, [&](auto out) {
      for (int64_t e = 0; e < call.count; ++e)
        out.store(call.recv, e, reduced[static_cast<size_t>(e)]);
    });
  };
  run_collective(shared, member, seq, call, cancel, exchange, finish);
}

}  // namespace

CpuComm::CpuComm(CpuDevice& device, std::shared_ptr<CommShared> shared, int member,
                 std::string name)
    : Comm(member, shared->world_ranks, std::move(name)),
      device_(device),
      shared_(std::move(shared)),
      member_(member) {}

void CpuComm::launch(Stream s, const CollectiveCall& call) {
  FSDP_CHECK(call.count == 0 || (call.send && call.recv), op_name(call.op), " on communicator '",
             name(), "': null buffer for ", call.count, " elements");
  const int64_t seq = next_seq_++;
  // The task holds the shared state alive; the device outlives its own streams' tasks.
  device_.enqueue(
      s, OpKind::Collective,
      [shared = shared_, member = member_, seq, call, world = device_.world().get(),
       cancel = &device_.cancellation()] { execute(*shared, member, seq, call, *world, *cancel); });
}

void CpuComm::do_all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) {
  launch(s, {CollectiveOp::AllGather, count, t, ReduceOp::Sum, 0, send, recv});
}

void CpuComm::do_reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                                Stream s) {
  launch(s, {CollectiveOp::ReduceScatter, count, t, op, 0, send, recv});
}

void CpuComm::do_all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                            Stream s) {
  FSDP_CHECK(count >= 0, "all_reduce count ", count);
  launch(s, {CollectiveOp::AllReduce, count, t, op, 0, send, recv});
}

void CpuComm::do_broadcast(void* buf, int64_t count, DType t, int root, Stream s) {
  FSDP_CHECK(count >= 0, "broadcast count ", count);
  launch(s, {CollectiveOp::Broadcast, count, t, ReduceOp::Sum, root, buf, buf});
}

void CpuComm::do_all_to_all(const void* send, const std::vector<int64_t>& send_counts,
                            void* recv, const std::vector<int64_t>& recv_counts, DType t,
                            Stream s) {
  CollectiveCall call;
  call.op = CollectiveOp::AllToAll;
  call.dtype = t;
  call.send = send;
  call.recv = recv;
  call.send_counts = send_counts;
  call.recv_counts = recv_counts;
  int64_t sent = 0, received = 0;
  for (int64_t c : send_counts) sent += c;
  for (int64_t c : recv_counts) received += c;
  FSDP_CHECK((send || sent == 0) && (recv || received == 0), "all_to_all on communicator '",
             name(), "': null buffer for ", sent, " elements sent and ", received, " received");
  const int64_t seq = next_seq_++;
  device_.enqueue(
      s, OpKind::Collective,
      [shared = shared_, member = member_, seq, call = std::move(call), world = device_.world().get(),
       cancel = &device_.cancellation()] { execute(*shared, member, seq, call, *world, *cancel); });
}

std::unique_ptr<Comm> CpuComm::do_split(int color, int key, const std::string& name) {
  CollectiveCall call;
  call.op = CollectiveOp::Split;
  call.color = color;
  call.key = key;
  const int64_t seq = next_seq_++;
  std::unique_ptr<Comm> result;
  auto exchange = [&](Rendezvous& rv) {
    if (color < 0) return;     // takes part in the exchange, joins nothing
    std::vector<int> members;  // parent members of our color, in (key, parent member) order
    for (int m = 0; m < shared_->size(); ++m)
      if (rv.calls[m].color == color) members.push_back(m);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return rv.calls[a].key < rv.calls[b].key; });
    std::vector<int> world_ranks;
    int my_index = -1;
    for (size_t i = 0; i < members.size(); ++i) {
      world_ranks.push_back(shared_->world_ranks[members[i]]);
      if (members[i] == member_) my_index = static_cast<int>(i);
    }
    std::shared_ptr<CommShared> child;
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      std::shared_ptr<CommShared>& slot = rv.split_children[color];
      if (!slot)
        slot = std::make_shared<CommShared>(name, world_ranks, shared_->link_gbps,
                                            shared_->timeout_s);
      child = slot;
    }
    result = std::make_unique<CpuComm>(device_, std::move(child), my_index, name);
  };
  run_collective(*shared_, member_, seq, call, device_.cancellation(), exchange, [] {});
  return result;
}

}  // namespace fsdp::cpu
