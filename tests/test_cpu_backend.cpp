// Tests of the CPU backend (src/backend/cpu): streams, events, memory, collectives, kernels.
// Ranks run as std::threads, as the launcher runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "fsdp/comm.h"
#include "fsdp/error.h"

namespace fsdp::cpu {
namespace {

using Floats = std::vector<float>;

float round_to(DType t, float v) {
  return t == DType::F32 ? v : bf16_to_float(float_to_bf16(v));
}

void* upload(Device& d, Stream s, const Floats& v, DType t, MemTag tag = MemTag::Other) {
  std::vector<char> host(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) store_from_float(host.data(), t, i, v[i]);
  void* p = d.alloc(host.size(), s, tag);
  d.copy_from_host(s, p, host.data(), host.size());
  return p;
}

Floats download(Device& d, Stream s, const void* p, int64_t n, DType t) {
  std::vector<char> host(static_cast<size_t>(n) * dtype_size(t));
  d.copy_to_host(s, host.data(), p, host.size());
  d.synchronize_stream(s);
  Floats out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(host.data(), t, i);
  return out;
}

// Runs fn(rank) on one thread per rank; a failing rank aborts the world so that the others
// end too, and its exception is rethrown here.
void run_ranks(CpuWorld& world, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] {
      this_thread_identity().rank = r;
      this_thread_identity().device = "cpu:" + std::to_string(r);
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        world.abort("rank " + std::to_string(r) + " failed");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

const TimelineOp* find_op(const Timeline& tl, const std::string& label) {
  for (const auto& op : tl.ops)
    if (op.label == label) return &op;
  return nullptr;
}

// ---- streams and events

TEST(CpuBackendStream, RunsInOrderAndReallyAsynchronously) {
  CpuWorld world(1, {});
  auto dev = world.make_device(0);
  Stream a = dev->create_stream("a", StreamPriority::Normal);
  Stream b = dev->create_stream("b", StreamPriority::High);
  dev->enable_timeline(true);
  float* x = static_cast<float*>(dev->alloc(4, a, MemTag::Other));
  float* y = static_cast<float*>(dev->alloc(4, a, MemTag::Other));
  float* z = static_cast<float*>(dev->alloc(4, a, MemTag::Other));
  const auto start = std::chrono::steady_clock::now();
  dev->set_label("spin a");
  dev->spin(a, 60000);
  dev->set_label("spin b");
  dev->spin(b, 60000);
  dev->set_label("copies");
  dev->fill(a, x, DType::F32, 1, 1.0f);
  dev->copy(a, y, x, 4);
  dev->fill(a, x, DType::F32, 1, 2.0f);
  dev->copy(a, z, x, 4);
  // Enqueuing returned long before the 60 ms of work could have run.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
  dev->record_host_span("host work", 1.0, 2.0);
  EXPECT_EQ(download(*dev, a, y, 1, DType::F32)[0], 1.0f);
  EXPECT_EQ(download(*dev, a, z, 1, DType::F32)[0], 2.0f);
  Timeline tl = dev->take_timeline();
  ASSERT_EQ(tl.stream_names, (std::vector<std::string>{"a", "b"}));
  const TimelineOp* sa = find_op(tl, "spin a");
  const TimelineOp* sb = find_op(tl, "spin b");
  ASSERT_TRUE(sa && sb);
  EXPECT_EQ(sa->stream, a.id);
  EXPECT_EQ(sb->stream, b.id);
  EXPECT_GE(sa->end_us - sa->start_us, 59000.0);
  std::vector<OpKind> copy_kinds;
  for (const auto& op : tl.ops)
    if (op.label == "copies") copy_kinds.push_back(op.kind);
  copy_kinds.resize(4);  // fill, copy, fill, copy (then the downloads)
  EXPECT_EQ(copy_kinds,
            (std::vector<OpKind>{OpKind::Kernel, OpKind::Copy, OpKind::Kernel, OpKind::Copy}));
  const TimelineOp* host = find_op(tl, "host work");
  ASSERT_TRUE(host);
  EXPECT_EQ(host->stream, -1);
  EXPECT_EQ(host->kind, OpKind::Host);
  // The two streams ran at the same time.
  EXPECT_LT(sb->start_us, sa->end_us);
  EXPECT_LT(sa->start_us, sb->end_us);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(z)})
    dev->free(p, a);
}

TEST(CpuBackendEvent, WaitCapturesTheGenerationRecordedAtCallTime) {
  CpuWorld world(1, {});
  auto dev = world.make_device(0);
  Stream producer = dev->create_stream("producer", StreamPriority::Normal);
  Stream consumer = dev->create_stream("consumer", StreamPriority::Normal);
  dev->enable_timeline(true);
  float* x = static_cast<float*>(dev->alloc(4, producer, MemTag::Other));
  float* y = static_cast<float*>(dev->alloc(4, producer, MemTag::Other));
  Event e = dev->create_event();
  EXPECT_TRUE(dev->query_event(e));  // never recorded
  dev->wait_event(consumer, e);      // never recorded: a no-op
  dev->set_label("produce 1");
  dev->spin(producer, 30000);
  dev->fill(producer, x, DType::F32, 1, 1.0f);
  dev->record_event(e, producer);
  EXPECT_FALSE(dev->query_event(e));
  dev->set_label("consume");
  dev->spin(consumer, 10000);  // the second record below happens before this wait runs
  dev->wait_event(consumer, e);
  dev->copy(consumer, y, x, 4);
  dev->set_label("produce 2");
  dev->spin(producer, 100000);
  dev->fill(producer, x, DType::F32, 1, 2.0f);
  dev->record_event(e, producer);
  // The consumer waited for the first record only, so it copied the first value.
  EXPECT_EQ(download(*dev, consumer, y, 1, DType::F32)[0], 1.0f);
  EXPECT_FALSE(dev->query_event(e));
  dev->synchronize_event(e);
  EXPECT_TRUE(dev->query_event(e));
  Timeline tl = dev->take_timeline();
  double produced_at = 0;  // when the fill that the first record follows ended
  for (const auto& op : tl.ops)
    if (op.label == "produce 1") produced_at = std::max(produced_at, op.end_us);
  int waits = 0;
  for (const auto& op : tl.ops) {
    if (op.kind != OpKind::Wait) continue;
    ++waits;
    EXPECT_EQ(op.waited_for, "produce 1");
    EXPECT_EQ(op.stream, consumer.id);
    EXPECT_GE(op.end_us, produced_at);  // it really blocked until the record point
  }
  EXPECT_EQ(waits, 1);
  dev->destroy_event(e);
  EXPECT_THROW(dev->record_event(e, producer), Error);
  dev->free(x, producer);
  dev->free(y, producer);
}

TEST(CpuBackendMemory, MissingWaitReadsPoisonAndTheWaitFixesIt) {
  CpuWorld world(1, {});  // checked mode is the default
  auto dev = world.make_device(0);
  Stream producer = dev->create_stream("producer", StreamPriority::Normal);
  Stream consumer = dev->create_stream("consumer", StreamPriority::Normal);
  float* x = static_cast<float*>(dev->alloc(64, producer, MemTag::Activation));
  float host = 0;
  // Without a wait, the consumer reads before the producer wrote: fresh memory is NaN.
  dev->spin(producer, 50000);
  dev->fill(producer, x, DType::F32, 16, 7.0f);
  dev->copy_to_host(consumer, &host, x, 4);
  dev->synchronize();
  EXPECT_TRUE(std::isnan(host));
  // With the wait, it sees the value.
  Event e = dev->create_event();
  dev->spin(producer, 20000);
  dev->fill(producer, x, DType::F32, 16, 8.0f);
  dev->record_event(e, producer);
  dev->wait_event(consumer, e);
  dev->copy_to_host(consumer, &host, x, 4);
  dev->synchronize();
  EXPECT_EQ(host, 8.0f);
  // A read after an early free (no event from the reader to the freeing stream) sees NaN.
  dev->free(x, producer);
  dev->spin(consumer, 50000);
  dev->copy_to_host(consumer, &host, x, 4);
  dev->synchronize();
  EXPECT_TRUE(std::isnan(host));
  dev->destroy_event(e);
}

TEST(CpuBackendMemory, CountersAreExactAtCallTime) {
  CpuWorld world(1, {});
  auto dev = world.make_device(0);
  Stream s = dev->create_stream("s", StreamPriority::Normal);
  dev->enable_timeline(true);
  dev->spin(s, 50000);  // the stream is far behind the calls below
  void* a = dev->alloc(100, s, MemTag::RsInput);
  void* b = dev->alloc(200, s, MemTag::RsInput);
  void* c = dev->alloc(50, s, MemTag::Grad);
  const int rs = static_cast<int>(MemTag::RsInput), grad = static_cast<int>(MemTag::Grad);
  MemStats m = dev->memory_stats();
  EXPECT_EQ(m.current_bytes, 350);
  EXPECT_EQ(m.peak_bytes, 350);
  EXPECT_EQ(m.tag_bytes[rs], 300);
  EXPECT_EQ(m.tag_live[rs], 2);
  EXPECT_EQ(m.tag_live[grad], 1);
  dev->free(a, s);
  m = dev->memory_stats();
  EXPECT_EQ(m.current_bytes, 250);
  EXPECT_EQ(m.peak_bytes, 350);
  EXPECT_EQ(m.tag_live[rs], 1);
  EXPECT_EQ(m.tag_peak_live[rs], 2);
  EXPECT_EQ(m.tag_peak_bytes[rs], 300);
  dev->reset_peak_memory();
  m = dev->memory_stats();
  EXPECT_EQ(m.peak_bytes, 250);
  EXPECT_EQ(m.tag_peak_live[rs], 1);
  EXPECT_THROW(dev->free(a, s), Error);  // double free
  int on_stack = 0;
  EXPECT_THROW(dev->free(&on_stack, s), Error);  // not ours
  dev->free(b, s);
  dev->free(c, s);
  EXPECT_EQ(dev->memory_stats().current_bytes, 0);
  Timeline tl = dev->take_timeline();
  ASSERT_EQ(tl.memory.size(), 6u);
  EXPECT_EQ(tl.memory[2].bytes, 350);
  EXPECT_EQ(tl.memory.back().bytes, 0);
}

TEST(CpuBackendDevice, TaskErrorsAreStickyAndNameTheRank) {
  CpuWorld world(1, {});
  auto dev = world.make_device(0);
  Stream s = dev->create_stream("s", StreamPriority::Normal);
  Floats logits = {1, 2, 3, 4};
  void* l = upload(*dev, s, logits, DType::F32);
  std::vector<int32_t> bad_labels = {0, 9};
  auto* labels = static_cast<int32_t*>(dev->alloc(8, s, MemTag::Other));
  dev->copy_from_host(s, labels, bad_labels.data(), 8);
  float* loss = static_cast<float*>(dev->alloc(4, s, MemTag::Other));
  dev->cross_entropy_loss(s, l, DType::F32, labels, 2, 2, loss, nullptr);
  try {
    dev->synchronize();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[rank 0 cpu:0]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("label 9"), std::string::npos) << e.what();
  }
  dev->fill(s, loss, DType::F32, 1, 0.0f);
  EXPECT_THROW(dev->synchronize(), Error);  // still failed
  for (void* p : {l, static_cast<void*>(labels), static_cast<void*>(loss)}) dev->free(p, s);
}

// ---- collectives

TEST(CpuBackendComm, EveryCollectiveMatchesAHandComputedResult) {
  const int64_t n = 37;
  auto v = [](int r, int64_t i) { return (r + 1) * 0.5f + static_cast<float>(i % 9) * 0.125f - 1; };
  for (int w : {1, 2, 3, 4, 8}) {
    for (DType t : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(testing::Message() << "world " << w << " " << dtype_name(t));
      CpuWorld world(w, {});
      run_ranks(world, [&](int r) {
        auto dev = world.make_device(r);
        auto comm = world.make_world_comm(r, *dev);
        Stream s = dev->create_stream("comm", StreamPriority::Normal);
        Floats mine(n), full(w * n);
        for (int64_t i = 0; i < n; ++i) mine[i] = v(r, i);
        for (int64_t i = 0; i < w * n; ++i) full[i] = v(r, i);
        void* ag_send = upload(*dev, s, mine, t);
        void* ag_recv = upload(*dev, s, Floats(w * n, -5), t);
        void* ag_inplace = upload(*dev, s, Floats(w * n, -5), t);
        dev->copy(s, static_cast<char*>(ag_inplace) + r * n * dtype_size(t), ag_send,
                  n * dtype_size(t));
        void* rs_send = upload(*dev, s, full, t);
        void* rs_sum = upload(*dev, s, Floats(n), t);
        void* rs_avg = upload(*dev, s, Floats(n), t);
        void* ar = upload(*dev, s, mine, t);
        void* ar_avg = upload(*dev, s, Floats(n), t);
        void* bc = upload(*dev, s, r == w - 1 ? mine : Floats(n, 99), t);
        comm->all_gather(ag_send, ag_recv, n, t, s);
        comm->all_gather(static_cast<char*>(ag_inplace) + r * n * dtype_size(t), ag_inplace, n, t,
                         s);
        comm->reduce_scatter(rs_send, rs_sum, n, t, ReduceOp::Sum, s);
        comm->reduce_scatter(rs_send, rs_avg, n, t, ReduceOp::Avg, s);
        comm->all_reduce(ar, ar_avg, n, t, ReduceOp::Avg, s);  // reads ar before it changes
        comm->all_reduce(ar, ar, n, t, ReduceOp::Sum, s);      // in place
        comm->broadcast(bc, n, t, w - 1, s);
        comm->all_reduce(nullptr, nullptr, 0, t, ReduceOp::Sum, s);
        EXPECT_EQ(comm->issued(CollectiveKind::AllGather), 2);
        EXPECT_EQ(comm->issued(CollectiveKind::AllReduce), 3);
        const Floats got_ag = download(*dev, s, ag_recv, w * n, t);
        const Floats got_inplace = download(*dev, s, ag_inplace, w * n, t);
        for (int j = 0; j < w; ++j)
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(got_ag[j * n + i], round_to(t, v(j, i)));
            ASSERT_EQ(got_inplace[j * n + i], round_to(t, v(j, i)));
          }
        const Floats sum = download(*dev, s, rs_sum, n, t), avg = download(*dev, s, rs_avg, n, t);
        const Floats ar_got = download(*dev, s, ar, n, t);
        const Floats ar_avg_got = download(*dev, s, ar_avg, n, t);
        const Floats bc_got = download(*dev, s, bc, n, t);
        for (int64_t i = 0; i < n; ++i) {
          float rs_ref = 0, ar_ref = 0;  // fp32, in rank order, of the dtype-rounded inputs
          for (int j = 0; j < w; ++j) {
            rs_ref += round_to(t, v(j, r * n + i));
            ar_ref += round_to(t, v(j, i));
          }
          ASSERT_EQ(sum[i], round_to(t, rs_ref));
          ASSERT_EQ(avg[i], round_to(t, rs_ref / w));
          ASSERT_EQ(ar_got[i], round_to(t, ar_ref));
          ASSERT_EQ(ar_avg_got[i], round_to(t, ar_ref / w));
          ASSERT_EQ(bc_got[i], round_to(t, v(w - 1, i)));
        }
        for (void* p : {ag_send, ag_recv, ag_inplace, rs_send, rs_sum, rs_avg, ar, ar_avg, bc})
          dev->free(p, s);
        dev->synchronize();
      });
    }
  }
}

TEST(CpuBackendComm, SplitOrdersByKeyAndSkipsNegativeColors) {
  CpuWorld world(5, {});
  run_ranks(world, [&](int r) {
    auto dev = world.make_device(r);
    auto comm = world.make_world_comm(r, *dev);
    Stream s = dev->create_stream("s", StreamPriority::Normal);
    const int color = r == 4 ? -1 : r % 2;
    auto sub = comm->split(color, -r, "sub");  // key -r: reverse rank order
    if (r == 4) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    ASSERT_NE(sub, nullptr);
    const std::vector<int> expect = color == 0 ? std::vector<int>{2, 0} : std::vector<int>{3, 1};
    EXPECT_EQ(sub->world_ranks(), expect);
    EXPECT_EQ(sub->rank(), r < 2 ? 1 : 0);
    void* buf = upload(*dev, s, Floats{static_cast<float>(r)}, DType::F32);
    sub->all_gather(buf, buf, 0, DType::F32, s);  // count 0 still meets
    void* out = upload(*dev, s, Floats(2), DType::F32);
    sub->all_gather(buf, out, 1, DType::F32, s);
    const Floats got = download(*dev, s, out, 2, DType::F32);
    EXPECT_EQ(got, (Floats{static_cast<float>(expect[0]), static_cast<float>(expect[1])}));
    dev->free(buf, s);
    dev->free(out, s);
  });
}

// Rank 1 holds its first collective back by 60 ms; rank 0's two collectives then show on its
// timeline whether the second one waited for the first.
void issue_two_collectives(bool same_comm, Timeline* rank0_timeline) {
  CpuWorld world(2, {});
  run_ranks(world, [&](int r) {
    auto dev = world.make_device(r);
    auto comm_a = world.make_world_comm(r, *dev);
    auto comm_b = comm_a->split(0, r, "b");
    Comm& second = same_comm ? *comm_a : *comm_b;
    Stream x = dev->create_stream("x", StreamPriority::Normal);
    Stream y = dev->create_stream("y", StreamPriority::Normal);
    void* bx = upload(*dev, x, Floats(1000, 1.0f), DType::F32);
    void* by = upload(*dev, y, Floats(1000, 1.0f), DType::F32);
    dev->synchronize();
    dev->enable_timeline(true);
    if (r == 1) dev->spin(x, 60000);
    dev->set_label("first");
    comm_a->all_reduce(bx, bx, 1000, DType::F32, ReduceOp::Sum, x);
    dev->set_label("second");
    second.all_reduce(by, by, 1000, DType::F32, ReduceOp::Sum, y);
    EXPECT_EQ(download(*dev, x, bx, 1, DType::F32)[0], 2.0f);
    EXPECT_EQ(download(*dev, y, by, 1, DType::F32)[0], 2.0f);
    if (r == 0) *rank0_timeline = dev->take_timeline();
    dev->free(bx, x);
    dev->free(by, y);
  });
}

TEST(CpuBackendComm, OneCommunicatorSerializesTwoOverlap) {
  Timeline same, separate;
  issue_two_collectives(true, &same);
  issue_two_collectives(false, &separate);
  const TimelineOp* f = find_op(same, "first");
  const TimelineOp* s = find_op(same, "second");
  ASSERT_TRUE(f && s);
  EXPECT_EQ(f->kind, OpKind::Collective);
  EXPECT_GE(f->end_us - f->start_us, 50000.0);  // it waited for rank 1
  EXPECT_LE(f->end_us, s->start_us);            // one at a time, in issue order
  f = find_op(separate, "first");
  s = find_op(separate, "second");
  ASSERT_TRUE(f && s);
  EXPECT_LT(s->start_us, f->end_us);  // the second communicator ran under the first
  EXPECT_LT(s->end_us, f->end_us);
}

TEST(CpuBackendComm, MismatchedCollectivesRaiseAnErrorNotAHang) {
  CpuWorld world(3, {});
  std::atomic<int> errors{0};
  run_ranks(world, [&](int r) {
    auto dev = world.make_device(r);
    auto comm = world.make_world_comm(r, *dev);
    Stream s = dev->create_stream("s", StreamPriority::Normal);
    void* buf = upload(*dev, s, Floats(12, 1.0f), DType::F32);
    comm->all_reduce(buf, buf, 4, DType::F32, ReduceOp::Sum, s);  // fine
    if (r == 2)
      comm->all_gather(buf, buf, 4, DType::F32, s);
    else
      comm->all_reduce(buf, buf, 4, DType::F32, ReduceOp::Sum, s);
    try {
      dev->synchronize();
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("collective mismatch on communicator 'world' at its collective #1"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("issued all_gather(count=4, fp32)"), std::string::npos) << what;
      ++errors;
    }
    dev->free(buf, s);
  });
  EXPECT_EQ(errors.load(), 3);
}

TEST(CpuBackendComm, AbortWakesARankBlockedInACollective) {
  CpuWorld world(2, {});
  auto dev0 = world.make_device(0);
  auto dev1 = world.make_device(1);
  auto comm0 = world.make_world_comm(0, *dev0);
  Stream s = dev0->create_stream("s", StreamPriority::Normal);
  void* buf = upload(*dev0, s, Floats(4, 1.0f), DType::F32);
  comm0->all_reduce(buf, buf, 4, DType::F32, ReduceOp::Sum, s);  // rank 1 never joins
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    world.abort("test abort");
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    dev0->synchronize();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aborted: test abort"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  aborter.join();
  EXPECT_TRUE(world.aborted());
  dev0->free(buf, s);
  // Destruction joins every worker without hanging.
}

TEST(CpuBackendComm, ChaosModeGivesTheSameResults) {
  auto run = [](CpuOptions options) {
    const int w = 3;
    const int64_t n = 101;
    std::vector<Floats> results(w);
    CpuWorld world(w, options);
    run_ranks(world, [&](int r) {
      auto dev = world.make_device(r);
      auto comm = world.make_world_comm(r, *dev);
      auto rs_comm = comm->split(0, r, "rs");
      Stream ag = dev->create_stream("ag", StreamPriority::Normal);
      Stream rs = dev->create_stream("rs", StreamPriority::High);
      Floats in(w * n);
      for (int64_t i = 0; i < w * n; ++i) in[i] = std::sin(0.37f * i + r);
      void* x = upload(*dev, ag, in, DType::BF16);
      void* gathered = dev->alloc(w * w * n * 2, ag, MemTag::AllGather);
      void* reduced = dev->alloc(n * 4, rs, MemTag::RsOutput);
      Event e = dev->create_event();
      for (int step = 0; step < 4; ++step) {
        comm->all_gather(x, gathered, w * n, DType::BF16, ag);
        dev->record_event(e, ag);
        dev->wait_event(rs, e);
        void* f32 = dev->alloc(w * n * 4, rs, MemTag::RsInput);
        dev->cast(rs, f32, DType::F32, gathered, DType::BF16, w * n);
        rs_comm->reduce_scatter(f32, reduced, n, DType::F32, ReduceOp::Avg, rs);
        comm->all_reduce(x, x, w * n, DType::BF16, ReduceOp::Avg, ag);
        dev->free(f32, rs);
        dev->record_event(e, rs);
        dev->wait_event(ag, e);  // the next all-gather overwrites what the cast read
      }
      results[r] = download(*dev, rs, reduced, n, DType::F32);
      Floats tail = download(*dev, ag, x, w * n, DType::BF16);
      results[r].insert(results[r].end(), tail.begin(), tail.end());
      dev->destroy_event(e);
      dev->free(x, ag);
      dev->free(gathered, ag);
      dev->free(reduced, rs);
    });
    return results;
  };
  const auto calm = run({});
  for (uint64_t seed : {1u, 2u, 3u}) {
    CpuOptions chaos;
    chaos.chaos = true;
    chaos.chaos_seed = seed;
    chaos.chaos_max_us = 200;
    EXPECT_EQ(run(chaos), calm) << "seed " << seed;
  }
}

// ---- kernels, against straightforward references

class CpuBackendKernels : public testing::Test {
 protected:
  CpuWorld world{1, {}};
  std::unique_ptr<Device> dev = world.make_device(0);
  Stream s = dev->create_stream("s", StreamPriority::Normal);
  std::vector<void*> owned;

  void* put(const Floats& v, DType t = DType::F32) {
    return owned.emplace_back(upload(*dev, s, v, t));
  }
  void* fresh(int64_t n, DType t = DType::F32) {  // poisoned (NaN) in checked mode
    return owned.emplace_back(dev->alloc(n * dtype_size(t), s, MemTag::Other));
  }
  Floats get(const void* p, int64_t n, DType t = DType::F32) { return download(*dev, s, p, n, t); }
  void TearDown() override {
    for (void* p : owned) dev->free(p, s);
    dev->synchronize();
  }
};

Floats ramp(int64_t n, float scale, float shift) {
  Floats v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(scale * i + shift) * 2;
  return v;
}

TEST_F(CpuBackendKernels, CopyInAndCopyOutRoundTripOddShapes) {
  const int w = 3;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{17, 257}, {5, 3}, {7, 1}, {1, 4}};
  std::vector<ShardSlice> slices;
  int64_t packed = 0;
  for (auto [rows, cols] : shapes) {
    slices.push_back({rows, cols, (rows + w - 1) / w, packed});
    packed += slices.back().rows_per_rank * cols;
  }
  const int count = static_cast<int>(shapes.size());
  // gap: elements at the end of the shard that no param covers; they must come out zero.
  for (auto [rs_t, gap] : {std::pair{DType::F32, 0}, {DType::BF16, 0}, {DType::F32, 5}}) {
    const int64_t shard = packed + gap;
    std::vector<Floats> grads;
    std::vector<const void*> srcs;
    std::vector<DType> types;
    for (int p = 0; p < count; ++p) {
      grads.push_back(ramp(shapes[p].first * shapes[p].second, 0.01f, static_cast<float>(p)));
      types.push_back(p % 2 ? DType::F32 : DType::BF16);
      srcs.push_back(put(grads[p], types[p]));
    }
    void* rs_in = fresh(w * shard, rs_t);
    dev->reduce_scatter_copy_in(s, rs_in, rs_t, shard, w, slices.data(), srcs.data(), types.data(),
                                count);
    srcs.assign(count, nullptr);  // descriptors were copied at enqueue time
    const Floats got = get(rs_in, w * shard, rs_t);
    Floats expect(w * shard, 0.0f);
    for (int p = 0; p < count; ++p)
      for (int r = 0; r < w; ++r)
        for (int64_t j = 0; j < slices[p].rows_per_rank; ++j)
          for (int64_t c = 0; c < slices[p].cols; ++c) {
            const int64_t row = r * slices[p].rows_per_rank + j;
            if (row < slices[p].rows)
              expect[r * shard + slices[p].offset + j * slices[p].cols + c] =
                  round_to(rs_t, round_to(types[p], grads[p][row * slices[p].cols + c]));
          }
    ASSERT_EQ(got, expect);
    std::vector<void*> dsts;
    for (int p = 0; p < count; ++p) dsts.push_back(fresh(grads[p].size(), rs_t));
    dev->all_gather_copy_out(s, rs_in, rs_t, shard, w, slices.data(), dsts.data(), count);
    for (int p = 0; p < count; ++p) {
      Floats back = get(dsts[p], grads[p].size(), rs_t);
      for (size_t i = 0; i < back.size(); ++i)
        ASSERT_EQ(back[i], round_to(rs_t, round_to(types[p], grads[p][i]))) << p << " " << i;
    }
  }
}

TEST_F(CpuBackendKernels, AdamWAndSgdMatchTwoStepsByHand) {
  const Floats p0 = {0.5f, -1.0f, 2.0f, 0.0f}, g1 = {0.1f, -0.2f, 0.3f, 0.0f},
               g2 = {-0.05f, 0.4f, 0.0f, 0.0f};
  const AdamWConfig c{0.1f, 0.9f, 0.999f, 1e-8f, 0.01f};
  std::vector<double> p(p0.begin(), p0.end()), m(4, 0), v(4, 0);
  for (int t = 1; t <= 2; ++t) {
    const Floats& g = t == 1 ? g1 : g2;
    for (int i = 0; i < 4; ++i) {
      p[i] *= 1.0 - double(c.lr) * c.weight_decay;
      m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g[i];
      v[i] = c.beta2 * v[i] + (1.0 - double(c.beta2)) * g[i] * g[i];
      const double mhat = m[i] / (1.0 - std::pow(double(c.beta1), t));
      const double vhat = v[i] / (1.0 - std::pow(double(c.beta2), t));
      p[i] -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
    }
  }
  auto* param = static_cast<float*>(put(p0));
  auto* grad = static_cast<float*>(put(g1));
  auto* exp_avg = static_cast<float*>(put(Floats(4, 0)));
  auto* exp_avg_sq = static_cast<float*>(put(Floats(4, 0)));
  // Two tensors in one launch: the first three elements and the last one.
  OptimTensor ts[2] = {{param, grad, exp_avg, exp_avg_sq, 3},
                       {param + 3, grad + 3, exp_avg + 3, exp_avg_sq + 3, 1}};
  dev->adamw_step(s, ts, 2, c, 1);
  dev->copy_from_host(s, grad, g2.data(), 16);
  dev->adamw_step(s, ts, 2, c, 2);
  const Floats got = get(param, 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], p[i], 2e-6) << i;
  EXPECT_EQ(got[3], 0.0f);  // padding stays zero

  // SGD, momentum 0.9, weight decay 0.1: g' = g + wd p; buf = 0.9 buf + g'; p -= lr buf.
  std::vector<double> q(p0.begin(), p0.end()), buf(4, 0);
  for (const Floats* g : {&g1, &g2})
    for (int i = 0; i < 4; ++i) {
      buf[i] = 0.9 * buf[i] + ((*g)[i] + 0.1 * q[i]);
      q[i] -= 0.5 * buf[i];
    }
  auto* sp = static_cast<float*>(put(p0));
  auto* sg = static_cast<float*>(put(g1));
  OptimTensor st{sp, sg, static_cast<float*>(put(Floats(4, 0))), nullptr, 4};
  dev->sgd_step(s, &st, 1, 0.5f, 0.9f, 0.1f);
  dev->copy_from_host(s, sg, g2.data(), 16);
  dev->sgd_step(s, &st, 1, 0.5f, 0.9f, 0.1f);
  const Floats sgot = get(sp, 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(sgot[i], q[i], 1e-6) << i;
  OptimTensor plain{sp, sg, nullptr, nullptr, 4};  // no momentum: no state needed
  dev->sgd_step(s, &plain, 1, 1.0f, 0.0f, 0.0f);
  const Floats pgot = get(sp, 4);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(pgot[i], sgot[i] - g2[i]);
}

TEST_F(CpuBackendKernels, LossesMatchReferences) {
  for (DType t : {DType::F32, DType::BF16}) {
    const Floats y = ramp(11, 0.7f, 0.3f);
    auto* loss = static_cast<float*>(fresh(1));
    void* dy = fresh(11, t);
    dev->mean_square_loss(s, put(y, t), t, 11, loss, dy);
    double ref = 0;
    for (float v : y) ref += double(round_to(t, v)) * round_to(t, v);
    EXPECT_NEAR(get(loss, 1)[0], ref / 11, 1e-6);
    const Floats dgot = get(dy, 11, t);
    for (int i = 0; i < 11; ++i) EXPECT_EQ(dgot[i], round_to(t, 2.0f / 11 * round_to(t, y[i])));

    const int64_t rows = 3, classes = 5;
    const Floats logits = ramp(rows * classes, 1.3f, 0.1f);
    const std::vector<int32_t> labels = {4, 0, 2};
    auto* lab = static_cast<int32_t*>(fresh(rows));
    dev->copy_from_host(s, lab, labels.data(), rows * 4);
    void* dl = fresh(rows * classes, t);
    dev->cross_entropy_loss(s, put(logits, t), t, lab, rows, classes, loss, dl);
    const Floats dlgot = get(dl, rows * classes, t);
    double total = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double z = 0;
      for (int64_t c = 0; c < classes; ++c)
        z += std::exp(double(round_to(t, logits[r * classes + c])));
      total += std::log(z) - round_to(t, logits[r * classes + labels[r]]);
      for (int64_t c = 0; c < classes; ++c) {
        const double p = std::exp(double(round_to(t, logits[r * classes + c]))) / z;
        EXPECT_NEAR(dlgot[r * classes + c], (p - (c == labels[r])) / rows,
                    t == DType::F32 ? 1e-6 : 2e-3);
      }
    }
    EXPECT_NEAR(get(loss, 1)[0], total / rows, 1e-5);
  }
}

TEST_F(CpuBackendKernels, SoftmaxBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, cols = 6;
  const Floats x = ramp(rows * cols, 0.9f, 0.2f), wts = ramp(rows * cols, 2.1f, 1.0f);
  auto softmax_loss = [&](const std::vector<double>& xs) {  // L = sum w * softmax(x)
    double loss = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double z = 0;
      for (int64_t c = 0; c < cols; ++c) z += std::exp(xs[r * cols + c]);
      for (int64_t c = 0; c < cols; ++c) loss += wts[r * cols + c] * std::exp(xs[r * cols + c]) / z;
    }
    return loss;
  };
  auto* probs = static_cast<float*>(fresh(rows * cols));
  dev->softmax_rows(s, put(x), DType::F32, probs, rows, cols);
  void* dx = fresh(rows * cols);
  dev->softmax_rows_backward(s, probs, static_cast<float*>(put(wts)), dx, DType::F32, rows, cols);
  const Floats got = get(dx, rows * cols), p = get(probs, rows * cols);
  std::vector<double> xs(x.begin(), x.end());
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double h = 1e-5, keep = xs[i];
    xs[i] = keep + h;
    const double up = softmax_loss(xs);
    xs[i] = keep - h;
    const double down = softmax_loss(xs);
    xs[i] = keep;
    EXPECT_NEAR(got[i], (up - down) / (2 * h), 1e-5) << i;
  }
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += p[r * cols + c];
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

TEST_F(CpuBackendKernels, GemmAllTransposesAndDtypes) {
  const int64_t m = 5, n = 7, k = 33;
  const Floats a = ramp(m * k, 0.37f, 0.0f), b = ramp(k * n, 0.11f, 1.0f),
               c0 = ramp(m * n, 0.5f, 2.0f);
  for (auto [ab_t, c_t] :
       {std::pair{DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}})
    for (int trans = 0; trans < 4; ++trans)
      for (float beta : {0.0f, 0.25f}) {
        const bool ta = trans & 1, tb = trans & 2;
        void* c = beta == 0 ? fresh(m * n, c_t) : put(c0, c_t);  // beta 0 never reads NaN C
        dev->gemm(s, ta, tb, m, n, k, 0.5f, put(a, ab_t), put(b, ab_t), ab_t, beta, c, c_t);
        const Floats got = get(c, m * n, c_t);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double ref = 0;  // a and b are read through the stored layouts
            for (int64_t q = 0; q < k; ++q)
              ref += double(round_to(ab_t, a[ta ? q * m + i : i * k + q])) *
                     round_to(ab_t, b[tb ? j * k + q : q * n + j]);
            ref = 0.5 * ref + (beta == 0 ? 0.0 : beta * double(round_to(c_t, c0[i * n + j])));
            const double tol = c_t == DType::F32 ? 1e-4 : 1e-2 * std::max(1.0, std::abs(ref));
            ASSERT_NEAR(got[i * n + j], ref, tol) << ta << tb << " " << dtype_name(ab_t);
          }
      }
}

TEST_F(CpuBackendKernels, ElementwiseKernelsMatchReferences) {
  const int64_t n = 13;
  const Floats x = ramp(n, 0.8f, -0.4f), y = ramp(n, 0.3f, 0.9f);
  for (DType t : {DType::F32, DType::BF16}) {
    void *px = put(x, t), *py = put(y, t);
    void *out = fresh(n, t), *out2 = fresh(n, t);
    dev->activation_forward(s, Activation::ReLU, px, out, t, n);
    dev->activation_backward(s, Activation::ReLU, px, py, out2, t, n);
    Floats f = get(out, n, t), g = get(out2, n, t);
    for (int64_t i = 0; i < n; ++i) {
      const float xi = round_to(t, x[i]);
      EXPECT_EQ(f[i], xi > 0 ? xi : 0.0f);
      EXPECT_EQ(g[i], xi > 0 ? round_to(t, y[i]) : 0.0f);
    }
    dev->activation_forward(s, Activation::GELU, px, out, t, n);
    dev->activation_backward(s, Activation::GELU, px, py, out2, t, n);
    f = get(out, n, t);
    g = get(out2, n, t);
    const double tol = t == DType::F32 ? 1e-5 : 1e-2;
    for (int64_t i = 0; i < n; ++i) {
      const double xi = round_to(t, x[i]), h = 1e-4;
      auto gelu = [](double v) {
        return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      };
      EXPECT_NEAR(f[i], gelu(xi), tol);
      EXPECT_NEAR(g[i], round_to(t, y[i]) * (gelu(xi + h) - gelu(xi - h)) / (2 * h), tol);
    }
    dev->add(s, out, px, py, t, n);
    f = get(out, n, t);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(f[i], round_to(t, round_to(t, x[i]) + round_to(t, y[i])));
    dev->fill(s, out, t, n, 1.1f);
    EXPECT_EQ(get(out, n, t), Floats(n, round_to(t, 1.1f)));
    // scale_rows: 3 rows of 4, weights every other float; then accumulate on top.
    const Floats w = {2.0f, 9.0f, -1.0f, 9.0f, 0.5f};
    void* so = fresh(12, t);
    dev->scale_rows(s, so, px, t, static_cast<float*>(put(w)), 2, 3, 4, false);
    dev->scale_rows(s, so, px, t, static_cast<float*>(put(w)), 2, 3, 4, true);
    f = get(so, 12, t);
    for (int64_t i = 0; i < 12; ++i) {
      const float once = round_to(t, w[(i / 4) * 2] * round_to(t, x[i]));
      EXPECT_EQ(f[i], round_to(t, once + w[(i / 4) * 2] * round_to(t, x[i])));
    }
    auto* dots = static_cast<float*>(put(Floats(6, -7.0f)));
    dev->row_dot(s, px, py, t, dots, 2, 3, 4);
    f = get(dots, 6);
    for (int64_t r = 0; r < 3; ++r) {
      float ref = 0;
      for (int64_t c = 0; c < 4; ++c) ref += round_to(t, x[r * 4 + c]) * round_to(t, y[r * 4 + c]);
      EXPECT_FLOAT_EQ(f[2 * r], ref);
      EXPECT_EQ(f[2 * r + 1], -7.0f);  // the stride skips it
    }
    auto* acc = static_cast<float*>(put(Floats(n, 1.0f)));
    dev->accumulate(s, acc, px, t, n, -0.5f);
    f = get(acc, n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(f[i], 1.0f - 0.5f * round_to(t, x[i]));
  }
  void* wide = put(x);
  void* narrow = fresh(n, DType::BF16);
  dev->cast(s, narrow, DType::BF16, wide, DType::F32, n);
  EXPECT_EQ(get(narrow, n, DType::BF16), get(put(x, DType::BF16), n, DType::BF16));
}

}  // namespace
}  // namespace fsdp::cpu
