// Note [Gloo collectives]
// CPU ranks that are processes (on one host or several) exchange data with Gloo's algorithms
// over its TCP transport; each rank's device is an ordinary CPU device (Note [CPU backend]).
//
//  - Streams and order. A collective is a task on a CPU stream, like the thread backend's
//    (Note [CPU collectives]): the host numbers it per communicator when it is issued, and the
//    task first waits until the communicator's previous collective finished on this rank. So
//    a communicator runs one collective at a time, in issue order, whatever stream it was
//    issued on, and Gloo's tags (numbered in issue order) never collide; different communicators
//    (split children, each with its own Gloo context) progress independently.
//  - Reductions. Gloo's allreduce reduces with a function over pairs of buffers along its
//    ring, and has no bf16 type. We do not use it: a reduce-scatter is Gloo's alltoallv (each
//    member receives every member's chunk for it) followed by a sum in fp32, in member order
//    0..n-1, rounded to the dtype once; an all-reduce is that over chunks of the buffer
//    followed by Gloo's allgatherv of the reduced chunks. The bytes on the wire are those of
//    a ring all-reduce, bf16 travels as bf16 and is summed in fp32 with one rounding, and the
//    arithmetic is exactly the thread backend's: ranks as threads and ranks as processes give
//    bit-identical results, which the parity tests check.
//  - Rendezvous. Gloo's contexts meet through the job's store (GlooStoreAdapter) under
//    "gloo/<communicator>"; split() exchanges (color, key) through the store too, then
//    connects a new context per color under the parent's prefix.
//  - Failures. Every Gloo operation carries the timeout (CpuOptions::collective_timeout_s,
//    the trainer's --timeout). A Gloo error (a peer's connection closed, or the timeout)
//    becomes an fsdp::Error naming the communicator, the collective and, from the job's
//    failure notice (Note [Failure notices]), the rank that was lost and why. Without a
//    notice (a peer alive but stuck elsewhere), the members that gave up on the collective
//    say so in the store, and the error names those that never did.
#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoallv.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/cpu_dtype_io.h"
#include "backend/cpu/cpu_stream.h"
#include "backend/gloo/gloo_backend.h"
#include "backend/gloo/gloo_store.h"
#include "fsdp/error.h"
#include "rendezvous/failure_notice.h"

namespace fsdp::gloo_backend {

namespace {

using rendezvous::Millis;

// What every communicator of one world shares: Gloo's transport device (its listening socket
// and event loop) and the job's store.
struct GlooProcess {
  std::shared_ptr<::gloo::transport::Device> transport;
  std::shared_ptr<rendezvous::Store> store;
  int world_rank = 0;
  Millis timeout{60000};
  double timeout_s = 60;
  std::string store_host;
};

struct GlooCommShared {
  std::string name;
  std::string key_prefix;        // this communicator's keys in the store
  std::vector<int> world_ranks;  // global rank of each member
  int member = 0;                // this rank's index
  std::shared_ptr<::gloo::Context> context;
  // Turn-taking: the collective numbered `finished` may run next on this rank.
  std::mutex mutex;
  std::condition_variable cv;
  int64_t finished = 0;
};

std::shared_ptr<::gloo::Context> connect(const GlooProcess& process, const std::string& prefix,
                                         const std::string& name, int member, int size) {
  auto context = std::make_shared<::gloo::rendezvous::Context>(member, size);
  context->setTimeout(process.timeout);
  GlooStoreAdapter store(std::make_shared<rendezvous::PrefixStore>(prefix, process.store),
                         process.timeout);
  auto transport = process.transport;
  try {
    context->connectFullMesh(store, transport);
  } catch (const ::gloo::Exception& e) {
    FSDP_FAIL("connecting communicator '", name, "' (member ", member, " of ", size,
              ") over Gloo failed: ", e.what());
  }
  return context;
}

// Which members never reached collective `seq`: each member that gave up on it says so in the
// store, and waits a little for the others to say so too. Those that never do were lost, or
// are stuck elsewhere (a hang, or collectives issued in different orders).
std::vector<int> members_missing_at(const GlooProcess& process, const GlooCommShared& comm,
                                    int64_t seq) {
  rendezvous::Store& store = *process.store;
  const std::string base = detail::concat(comm.key_prefix, "/gave_up/", seq, "/");
  std::vector<std::string> keys;
  for (size_t m = 0; m < comm.world_ranks.size(); ++m) keys.push_back(base + std::to_string(m));
  std::vector<int> missing;
  try {
    store.set(keys[static_cast<size_t>(comm.member)], "1");
    const auto deadline = std::chrono::steady_clock::now() + std::min(process.timeout, Millis(5000));
    std::vector<bool> present = store.check(keys);
    while (std::find(present.begin(), present.end(), false) != present.end() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      present = store.check(keys);
    }
    for (size_t m = 0; m < present.size(); ++m)
      if (!present[m]) missing.push_back(comm.world_ranks[m]);
  } catch (const std::exception&) {
    // The store is gone with its host: nothing more to learn.
  }
  return missing;
}

// The error of a collective that Gloo gave up on: who was lost, as far as the job knows.
std::string failure_message(const GlooProcess& process, const GlooCommShared& comm,
                            const char* op, int64_t seq, const std::string& gloo_what) {
  std::string out = detail::concat(op, " #", seq, " on communicator '", comm.name, "' failed");
  // The launcher that reaped a lost rank may be a moment behind the broken connection.
  const auto notice =
      rendezvous::read_failure(*process.store, std::min(process.timeout, Millis(5000)));
  if (notice && notice->rank != process.world_rank)
    return out + detail::concat(": lost rank ", notice->rank, " (", notice->message, ") [Gloo: ",
                                gloo_what, "]");
  if (!rendezvous::store_answers(*process.store))
    return out + detail::concat(": a peer's connection broke, and the store does not answer "
                                "either: ", process.store_host, ", which hosts it, is lost [Gloo: ",
                                gloo_what, "]");
  if (gloo_what.find("Timed out") != std::string::npos)
    out += detail::concat(": no answer from a peer within the timeout of ", process.timeout_s,
                          " s, and no rank reported a failure");
  else
    out += ": a peer's connection broke, and no rank reported a failure";
  const std::vector<int> missing = members_missing_at(process, comm, seq);
  if (!missing.empty())
    out += detail::concat("; ", rendezvous::describe_ranks(missing),
                          missing.size() == 1 ? " has" : " have", " not reached it (lost, hung, "
                          "or issuing collectives in a different order)");
  return out + " [Gloo: " + gloo_what + "]";
}

// Sum (or mean) of `members` chunks of `count` elements laid out one after another, in
// member order and in fp32, rounded to t once: the thread backend's arithmetic exactly.
void reduce_chunks(const void* chunks, int members, int64_t count, DType t, ReduceOp op,
                   void* out) {
  std::vector<float> acc(static_cast<size_t>(count), op == ReduceOp::Max ? -INFINITY : 0.0f);
  cpu::with_io(t, [&](auto io) {
    for (int m = 0; m < members; ++m)
      for (int64_t e = 0; e < count; ++e) {
        float& a = acc[static_cast<size_t>(e)];
        const float v = io.load(chunks, m * count + e);
        a = op != ReduceOp::Max ? a + v : (std::isnan(a) || std::isnan(v)) ? NAN : std::max(a, v);
      }
    const float n = static_cast<float>(members);
    for (int64_t e = 0; e < count; ++e)
      io.store(out, e, op == ReduceOp::Avg ? acc[static_cast<size_t>(e)] / n
                                           : acc[static_cast<size_t>(e)]);
  });
}

// Gloo's buffers want a pointer even for zero bytes.
char g_empty[1];
void* or_empty(const void* p) { return p ? const_cast<void*>(p) : g_empty; }

class GlooComm final : public Comm {
 public:
  GlooComm(cpu::CpuDevice& device, std::shared_ptr<GlooProcess> process,
           std::shared_ptr<GlooCommShared> shared)
      : Comm(shared->member, shared->world_ranks, shared->name),
        device_(device),
        process_(std::move(process)),
        shared_(std::move(shared)) {}

 protected:
  void do_all_gather(const void* send, void* recv, int64_t count, DType t, Stream s) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(t);
    const int n = size(), me = rank();
    launch(s, "all_gather", bytes == 0, [=](const std::shared_ptr<::gloo::Context>& ctx, uint32_t tag) {
      ::gloo::AllgatherOptions opts(ctx);
      char* out = static_cast<char*>(recv);
      // In place, our own chunk already sits where it belongs.
      if (send != out + me * bytes) opts.setInput(const_cast<char*>(static_cast<const char*>(send)), bytes);
      opts.setOutput(out, bytes * n);
      opts.setTag(tag);
      ::gloo::allgather(opts);
    });
  }

  void do_reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                         Stream s) override {
    const size_t elem = dtype_size(t);
    const int n = size();
    launch(s, "reduce_scatter", count == 0, [=](const std::shared_ptr<::gloo::Context>& ctx, uint32_t tag) {
      // chunks[j]: member j's chunk for us.
      std::vector<char> chunks(static_cast<size_t>(count) * elem * n);
      const std::vector<int64_t> per_peer(static_cast<size_t>(n), count * static_cast<int64_t>(elem));
      ::gloo::AlltoallvOptions opts(ctx);
      opts.setInput(const_cast<char*>(static_cast<const char*>(send)), per_peer);
      opts.setOutput(chunks.data(), per_peer);
      opts.setTag(tag);
      ::gloo::alltoallv(opts);
      reduce_chunks(chunks.data(), n, count, t, op, recv);
    });
  }

  void do_all_reduce(const void* send, void* recv, int64_t count, DType t, ReduceOp op,
                     Stream s) override {
    FSDP_CHECK(count >= 0, "all_reduce count ", count);
    const size_t elem = dtype_size(t);
    const int n = size(), me = rank();
    launch(s, "all_reduce", count == 0, [=](const std::shared_ptr<::gloo::Context>& ctx, uint32_t tag) {
      // Member j reduces elements [first_j, first_j + len_j): the first count % n get one more.
      std::vector<int64_t> len(static_cast<size_t>(n), count / n);
      for (int j = 0; j < count % n; ++j) ++len[static_cast<size_t>(j)];
      const int64_t mine = len[static_cast<size_t>(me)];
      std::vector<int64_t> send_bytes(len.size()), recv_bytes(len.size(), mine * static_cast<int64_t>(elem));
      for (size_t j = 0; j < len.size(); ++j) send_bytes[j] = len[j] * static_cast<int64_t>(elem);
      std::vector<char> chunks(static_cast<size_t>(mine) * elem * n + 1);
      ::gloo::AlltoallvOptions scatter(ctx);
      scatter.setInput(const_cast<char*>(static_cast<const char*>(send)), send_bytes);
      scatter.setOutput(chunks.data(), recv_bytes);
      scatter.setTag(tag);
      ::gloo::alltoallv(scatter);
      std::vector<char> reduced(static_cast<size_t>(mine) * elem + 1);
      reduce_chunks(chunks.data(), n, mine, t, op, reduced.data());
      // Every member gathers the reduced chunks; send is no longer read, so recv may be send.
      ::gloo::AllgathervOptions gather(ctx);
      std::vector<size_t> gather_bytes(send_bytes.begin(), send_bytes.end());
      gather.setInput(reduced.data(), static_cast<size_t>(mine) * elem);
      gather.setOutput(static_cast<char*>(recv), gather_bytes);
      gather.setTag(tag + 1);
      ::gloo::allgatherv(gather);
    }, /*tags=*/2);
  }

  void do_broadcast(void* buf, int64_t count, DType t, int root, Stream s) override {
    FSDP_CHECK(count >= 0, "broadcast count ", count);
    FSDP_CHECK(root >= 0 && root < size(), "broadcast root ", root, " on communicator '", name(),
               "' of ", size());
    const size_t bytes = static_cast<size_t>(count) * dtype_size(t);
    launch(s, "broadcast", bytes == 0, [=](const std::shared_ptr<::gloo::Context>& ctx, uint32_t tag) {
      ::gloo::BroadcastOptions opts(ctx);
      opts.setOutput(static_cast<char*>(buf), bytes);
      opts.setRoot(root);
      opts.setTag(tag);
      ::gloo::broadcast(opts);
    });
  }

  void do_all_to_all(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                     const std::vector<int64_t>& recv_counts, DType t, Stream s) override {
    FSDP_CHECK(static_cast<int>(send_counts.size()) == size() &&
                   static_cast<int>(recv_counts.size()) == size(),
               "all_to_all on communicator '", name(), "' of ", size(), ": ", send_counts.size(),
               " send counts and ", recv_counts.size(), " receive counts");
    const int64_t elem = static_cast<int64_t>(dtype_size(t));
    std::vector<int64_t> send_bytes, recv_bytes;
    int64_t sent = 0, received = 0;
    for (int64_t c : send_counts) send_bytes.push_back(c * elem), sent += c;
    for (int64_t c : recv_counts) recv_bytes.push_back(c * elem), received += c;
    FSDP_CHECK((send || sent == 0) && (recv || received == 0), "all_to_all on communicator '",
               name(), "': null buffer for ", sent, " elements sent and ", received, " received");
    launch(s, "all_to_all", false, [=](const std::shared_ptr<::gloo::Context>& ctx, uint32_t tag) {
      ::gloo::AlltoallvOptions opts(ctx);
      opts.setInput(static_cast<char*>(or_empty(send)), send_bytes);
      opts.setOutput(static_cast<char*>(or_empty(recv)), recv_bytes);
      opts.setTag(tag);
      ::gloo::alltoallv(opts);
    });
  }

  std::unique_ptr<Comm> do_split(int color, int key, const std::string& name) override {
    const GlooCommShared& parent = *shared_;
    const std::string base = detail::concat(parent.key_prefix, "/split", splits_++);
    rendezvous::Store& store = *process_->store;
    store.set(detail::concat(base, "/", parent.member), detail::concat(color, " ", key));
    std::vector<std::string> keys, labels;
    for (int m = 0; m < size(); ++m) {
      keys.push_back(detail::concat(base, "/", m));
      labels.push_back(detail::concat("rank ", parent.world_ranks[static_cast<size_t>(m)]));
    }
    store.wait_all(keys, labels, detail::concat("split of communicator '", parent.name, "'"),
                   process_->timeout);
    if (color < 0) return nullptr;
    // Members of our color in (key, parent member) order, as the thread backend orders them.
    std::vector<std::pair<int, int>> members;  // (key, parent member)
    for (int m = 0; m < size(); ++m) {
      int c = 0, k = 0;
      const std::string value = store.get(keys[static_cast<size_t>(m)], process_->timeout);
      FSDP_CHECK(std::sscanf(value.c_str(), "%d %d", &c, &k) == 2, "split: bad entry '", value, "'");
      if (c == color) members.emplace_back(k, m);
    }
    std::stable_sort(members.begin(), members.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    auto child = std::make_shared<GlooCommShared>();
    child->name = name;
    child->key_prefix = detail::concat(base, "/color", color);
    for (size_t i = 0; i < members.size(); ++i) {
      child->world_ranks.push_back(parent.world_ranks[static_cast<size_t>(members[i].second)]);
      if (members[i].second == parent.member) child->member = static_cast<int>(i);
    }
    child->context = connect(*process_, child->key_prefix, name, child->member,
                             static_cast<int>(members.size()));
    return std::make_unique<GlooComm>(device_, process_, std::move(child));
  }

 private:
  using Body = std::function<void(const std::shared_ptr<::gloo::Context>&, uint32_t tag)>;

  // Numbers the collective now (issue order) and enqueues it on s; `empty` collectives move
  // no bytes and only take their turn.
  void launch(Stream s, const char* op, bool empty, Body body, uint32_t tags = 1) {
    const int64_t seq = next_seq_++;
    const uint32_t tag = next_tag_;
    next_tag_ += tags;
    device_.enqueue(s, OpKind::Collective,
                    [process = process_, shared = shared_, cancel = &device_.cancellation(), op,
                     seq, tag, empty, body = std::move(body)] {
                      run(*process, *shared, *cancel, op, seq, tag, empty, body);
                    });
  }

  static void run(const GlooProcess& process, GlooCommShared& comm,
                  const cpu::Cancellation& cancel, const char* op, int64_t seq, uint32_t tag,
                  bool empty, const Body& body) {
    {
      std::unique_lock<std::mutex> lock(comm.mutex);
      // The previous collective times out on its own; here only an abort or a failure of this
      // device (which skips that collective) can keep our turn from coming.
      while (comm.finished != seq) {
        lock.unlock();
        cancel.throw_if_cancelled();
        lock.lock();
        comm.cv.wait_for(lock, cpu::kCancelPollInterval, [&] { return comm.finished == seq; });
      }
    }
    auto done = [&] {
      std::lock_guard<std::mutex> lock(comm.mutex);
      comm.finished = seq + 1;
      comm.cv.notify_all();
    };
    cpu::restart_task_clock();  // queueing behind the previous collective is not collective time
    try {
      cpu::chaos_pause_on_this_thread();
      if (!empty) body(comm.context, tag);
    } catch (const ::gloo::Exception& e) {
      done();
      throw Error(failure_message(process, comm, op, seq, e.what()));
    } catch (...) {
      done();
      throw;
    }
    cpu::stop_task_clock();
    done();
  }

  cpu::CpuDevice& device_;
  std::shared_ptr<GlooProcess> process_;
  std::shared_ptr<GlooCommShared> shared_;
  int64_t next_seq_ = 0;   // host side: the rank's thread issues collectives
  uint32_t next_tag_ = 0;  // Gloo tags: one per Gloo operation, in issue order
  int64_t splits_ = 0;
};

std::atomic<int> g_worlds_made{0};

}  // namespace

bool built() { return true; }

std::unique_ptr<Comm> make_world_comm(Device& device, std::shared_ptr<rendezvous::Store> store,
                                      const GlooWorldOptions& options) {
  auto* cpu_device = dynamic_cast<cpu::CpuDevice*>(&device);
  FSDP_CHECK(cpu_device != nullptr, "a Gloo communicator needs a CPU device, got ", device.name());
  FSDP_CHECK(options.size >= 1 && options.rank >= 0 && options.rank < options.size, "rank ",
             options.rank, " of a Gloo world of ", options.size);
  FSDP_CHECK(options.timeout_s > 0, "the Gloo timeout must be > 0 s, got ", options.timeout_s);
  auto process = std::make_shared<GlooProcess>();
  process->store = std::move(store);
  process->world_rank = options.rank;
  process->timeout_s = options.timeout_s;
  process->store_host = options.store_host;
  process->timeout = Millis(static_cast<int64_t>(options.timeout_s * 1000));
  ::gloo::transport::tcp::attr attr;
  attr.hostname = options.listen_address;
  try {
    process->transport = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const ::gloo::Exception& e) {
    FSDP_FAIL("Gloo cannot listen on '", options.listen_address, "': ", e.what());
  }
  const int k = g_worlds_made.fetch_add(1);
  auto shared = std::make_shared<GlooCommShared>();
  shared->name = k == 0 ? "world" : detail::concat("world#", k);
  shared->key_prefix = "gloo/" + shared->name;
  shared->world_ranks.resize(static_cast<size_t>(options.size));
  for (int r = 0; r < options.size; ++r) shared->world_ranks[static_cast<size_t>(r)] = r;
  shared->member = options.rank;
  shared->context = connect(*process, shared->key_prefix, shared->name, options.rank, options.size);
  return std::make_unique<GlooComm>(*cpu_device, std::move(process), std::move(shared));
}

}  // namespace fsdp::gloo_backend
