// Tests of the CPU backend (src/backend/cpu): streams, events, memory, devices, collectives.
// The compute kernels are tested in test_cpu_kernels.cpp. Ranks run as std::threads, as the
// launcher runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"
#include "fsdp/comm.h"
#include "fsdp/error.h"

namespace fsdp::cpu {
namespace {

using cpu_test::download;
using cpu_test::Floats;
using cpu_test::round_to;
using cpu_test::upload;

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

// Tests that order work by spinning run on the virtual clock (Note [Virtual clock]), so the
// order is certain and the times exact on a loaded machine too.
CpuOptions virtual_time() {
  CpuOptions o;
  o.virtual_clock = true;
  return o;
}

const TimelineOp* find_op(const Timeline& tl, const std::string& label) {
  for (const auto& op : tl.ops)
    if (op.label == label) return &op;
  return nullptr;
}

// ---- streams and events

TEST(CpuBackendStream, RunsInOrderAndReallyAsynchronously) {
  CpuWorld world(1, virtual_time());
  auto dev = world.make_device(0);
  Stream a = dev->create_stream("a", StreamPriority::Normal);
  Stream b = dev->create_stream("b", StreamPriority::High);
  dev->enable_timeline(true);
  float* x = static_cast<float*>(dev->alloc(4, a, MemTag::Other));
  float* y = static_cast<float*>(dev->alloc(4, a, MemTag::Other));
  float* z = static_cast<float*>(dev->alloc(4, a, MemTag::Other));
  dev->set_label("spin a");
  dev->spin(a, 60000);
  dev->set_label("spin b");
  dev->spin(b, 60000);
  dev->set_label("copies");
  dev->fill(a, x, DType::F32, 1, 1.0f);
  dev->copy(a, y, x, 4);
  dev->fill(a, x, DType::F32, 1, 2.0f);
  dev->copy(a, z, x, 4);
  // Enqueuing returned before the 60 ms of work ran (a query that says so lets time move on).
  EXPECT_EQ(dev->now_us(), 0.0);
  Event after = dev->create_event();
  dev->record_event(after, a);
  EXPECT_FALSE(dev->query_event(after));
  dev->destroy_event(after);
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
  EXPECT_EQ(sa->end_us - sa->start_us, 60000.0);
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
  EXPECT_EQ(sa->start_us, 0.0);
  EXPECT_EQ(sb->start_us, 0.0);
  EXPECT_EQ(sb->end_us, 60000.0);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(z)})
    dev->free(p, a);
}

TEST(CpuBackendEvent, WaitCapturesTheGenerationRecordedAtCallTime) {
  CpuWorld world(1, virtual_time());
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
    EXPECT_EQ(op.end_us, produced_at);  // it really blocked until the record point
    EXPECT_EQ(op.end_us, 30000.0);
  }
  EXPECT_EQ(waits, 1);
  dev->destroy_event(e);
  EXPECT_THROW(dev->record_event(e, producer), Error);
  dev->free(x, producer);
  dev->free(y, producer);
}

TEST(CpuBackendMemory, MissingWaitReadsPoisonAndTheWaitFixesIt) {
  CpuWorld world(1, virtual_time());  // checked mode is the default
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
  CpuWorld world(2, virtual_time());
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
  EXPECT_EQ(f->end_us - f->start_us, 60000.0);  // it waited for rank 1
  EXPECT_EQ(s->start_us, f->end_us);             // one at a time, in issue order
  f = find_op(separate, "first");
  s = find_op(separate, "second");
  ASSERT_TRUE(f && s);
  EXPECT_EQ(s->start_us, 0.0);  // the second communicator ran under the first
  EXPECT_EQ(s->end_us, 0.0);
  EXPECT_EQ(f->end_us, 60000.0);
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

// A destructor frees host memory that queued work writes (a copy_to_host after a collective).
// The world's abort cancels synchronize()'s wait at once, but the collective's task sees it only
// at its next poll, and the copy after it still runs or is skipped later: the destructor's wait
// must outlast both, or the copy lands in freed heap memory.
TEST(CpuBackendComm, ADestructorsWaitOutlastsTheAbortOfTheWorkItWaitsFor) {
  CpuWorld world(2, {});
  auto dev0 = world.make_device(0);
  auto comm0 = world.make_world_comm(0, *dev0);
  Stream s = dev0->create_stream("s", StreamPriority::Normal);
  void* buf = upload(*dev0, s, Floats(4, 1.0f), DType::F32);
  dev0->synchronize();
  comm0->all_reduce(buf, buf, 4, DType::F32, ReduceOp::Sum, s);  // rank 1 never joins
  std::vector<float> host(4, 0.0f);
  dev0->copy_to_host(s, host.data(), buf, 4 * sizeof(float));
  Event copied = dev0->create_event();
  dev0->record_event(copied, s);
  world.abort("test abort");
  synchronize_in_destructor(*dev0);
  EXPECT_TRUE(dev0->query_event(copied)) << "work was still queued when the wait returned";
  dev0->destroy_event(copied);
  dev0->free(buf, s);
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

}  // namespace
}  // namespace fsdp::cpu
