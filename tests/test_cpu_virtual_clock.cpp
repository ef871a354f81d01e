// The CPU backend's virtual clock (Note [Virtual clock]): timed ops take exact simulated
// time, ranks stay in step through collectives, a slow host thread does not shift simulated
// time, and chaos delays are simulated too, so a seed gives one exact timeline.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"
#include "fsdp/comm.h"
#include "fsdp/error.h"
#include "runtime/launch.h"
#include "test_util.h"

namespace fsdp::cpu {
namespace {

using cpu_test::Floats;
using cpu_test::upload;

constexpr double kExact = 1e-6;  // us: simulated times are exact up to the doubles' rounding

CpuOptions virtual_time() {
  CpuOptions o;
  o.virtual_clock = true;
  return o;
}

const TimelineOp& op_named(const Timeline& tl, const std::string& label) {
  for (const auto& op : tl.ops)
    if (op.label == label) return op;
  throw Error("no op labelled " + label);
}

TEST(CpuVirtualClock, SpinsTakeExactlyTheirTimeOnEachStream) {
  CpuWorld world(1, virtual_time());
  auto dev = world.make_device(0);
  Stream a = dev->create_stream("a", StreamPriority::Normal);
  Stream b = dev->create_stream("b", StreamPriority::Normal);
  dev->enable_timeline(true);
  dev->set_label("a1");
  dev->spin(a, 250);
  dev->set_label("a2");
  dev->spin(a, 750);
  dev->set_label("b1");
  dev->spin(b, 600);
  // An hour of simulated time costs no wall time (slept, this test would time out).
  dev->set_label("long");
  dev->spin(b, 3.6e9);
  dev->synchronize();
  EXPECT_NEAR(dev->now_us(), 600 + 3.6e9, kExact);
  const Timeline tl = dev->take_timeline();
  EXPECT_NEAR(op_named(tl, "a1").start_us, 0, kExact);
  EXPECT_NEAR(op_named(tl, "a1").end_us, 250, kExact);
  EXPECT_NEAR(op_named(tl, "a2").start_us, 250, kExact);
  EXPECT_NEAR(op_named(tl, "a2").end_us, 1000, kExact);
  EXPECT_NEAR(op_named(tl, "b1").end_us, 600, kExact);
  EXPECT_NEAR(op_named(tl, "long").start_us, 600, kExact);
}

// The host is a participant: while it is still issuing work, simulated time stands still,
// however long the OS keeps it from running. Without that, the first spin would have run
// to its end while the host slept, and the second would start at 1000.
TEST(CpuVirtualClock, ASlowHostDoesNotShiftSimulatedTime) {
  CpuWorld world(1, virtual_time());
  auto dev = world.make_device(0);
  Stream a = dev->create_stream("a", StreamPriority::Normal);
  Stream b = dev->create_stream("b", StreamPriority::Normal);
  dev->enable_timeline(true);
  dev->set_label("first");
  dev->spin(a, 1000);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // a preempted host
  dev->set_label("second");
  dev->spin(b, 1000);
  dev->synchronize();
  const Timeline tl = dev->take_timeline();
  EXPECT_NEAR(op_named(tl, "second").start_us, 0, kExact);
  EXPECT_NEAR(dev->now_us(), 1000, kExact);
}

// Rank 0 computes for 1 ms and rank 1 for 3 ms before an all-gather that takes L on the
// link: both leave it at 3 ms + L, rank 0 having waited for rank 1 from 1 ms on. An event
// wait makes the comm stream follow compute.
TEST(CpuVirtualClock, CollectivesKeepRanksInStepAndTakeTheLinkTime) {
  CpuOptions o = virtual_time();
  o.link_gbps = 0.0078125;  // 4 KiB from the peer take 4096 / 7.8125 us
  const double link_us = 4096 / 7.8125;
  std::vector<Timeline> timelines(2);
  std::vector<double> end_us(2);
  runtime::run_cpu_ranks(2, o, [&](int rank, Device& dev, std::shared_ptr<Comm> comm) {
    Stream compute = dev.create_stream("compute", StreamPriority::Normal);
    Stream ag = dev.create_stream("ag", StreamPriority::High);
    void* in = upload(dev, compute, Floats(1024, 1.0f + rank), DType::F32);
    void* out = dev.alloc(2 * 1024 * sizeof(float), ag, MemTag::AllGather);
    dev.synchronize();
    dev.enable_timeline(true);
    dev.set_label("compute");
    dev.spin(compute, rank == 0 ? 1000 : 3000);
    Event done = dev.create_event();
    dev.record_event(done, compute);
    dev.set_label("wait");
    dev.wait_event(ag, done);
    dev.set_label("gather");
    comm->all_gather(in, out, 1024, DType::F32, ag);
    const Floats gathered = cpu_test::download(dev, ag, out, 2048, DType::F32);
    EXPECT_EQ(gathered[0], 1.0f);
    EXPECT_EQ(gathered[2047], 2.0f);
    end_us[rank] = dev.now_us();
    timelines[rank] = dev.take_timeline();
    dev.destroy_event(done);
    dev.free(in, compute);
    dev.free(out, ag);
  });
  for (int r : {0, 1}) {
    EXPECT_NEAR(end_us[r], 3000 + link_us, kExact);
    EXPECT_NEAR(op_named(timelines[r], "gather").start_us, r == 0 ? 1000 : 3000, kExact);
    EXPECT_NEAR(op_named(timelines[r], "gather").end_us, 3000 + link_us, kExact);
    EXPECT_NEAR(op_named(timelines[r], "wait").end_us, r == 0 ? 1000 : 3000, kExact);
  }
}

// A host that polls an event steps through simulated time: each "not yet" moves it to the
// next wake-up (300 us: b's spin; then 1000 us: a's), the same on every run.
TEST(CpuVirtualClock, PollingAnEventStepsThroughSimulatedTime) {
  CpuWorld world(1, virtual_time());
  auto dev = world.make_device(0);
  Stream a = dev->create_stream("a", StreamPriority::Normal);
  Stream b = dev->create_stream("b", StreamPriority::Normal);
  dev->spin(a, 1000);
  Event e = dev->create_event();
  dev->record_event(e, a);
  dev->spin(b, 300);
  std::vector<double> seen;
  while (!dev->query_event(e)) seen.push_back(dev->now_us());
  EXPECT_EQ(seen, (std::vector<double>{300, 1000}));
  EXPECT_EQ(dev->now_us(), 1000.0);
  dev->destroy_event(e);
}

// Simulated time starts once every rank's device exists; a rank that never makes one is a
// failure after the collective timeout (a bound, not a timing assertion), not a hang.
TEST(CpuVirtualClock, ARankThatNeverComesFailsTimedOpsInsteadOfHanging) {
  CpuOptions o = virtual_time();
  o.collective_timeout_s = 0.2;
  CpuWorld world(2, o);
  auto dev = world.make_device(0);
  Stream s = dev->create_stream("s", StreamPriority::Normal);
  dev->spin(s, 10);
  try {
    dev->synchronize();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("simulated time cannot start: 1 rank(s) of the world "
                                         "have not made their device"),
              std::string::npos)
        << e.what();
  }
}

TEST(CpuVirtualClock, OneDevicePerHostThread) {
  CpuWorld world(2, virtual_time());
  auto dev0 = world.make_device(0);
  EXPECT_THROW(world.make_device(1), Error);
}

// ---- chaos mode on the virtual clock

using OpKey = std::tuple<int, std::string, double, double>;

std::vector<OpKey> sorted_ops(const Timeline& tl) {
  std::vector<OpKey> out;
  for (const auto& op : tl.ops) out.emplace_back(op.stream, op.label, op.start_us, op.end_us);
  std::sort(out.begin(), out.end());
  return out;
}

double last_end_us(const Timeline& tl) {
  double end = 0;
  for (const auto& op : tl.ops) end = std::max(end, op.end_us);
  return end;
}

runtime::TrainConfig chaos_config() {
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 3;
  c.model.dim = 12;
  c.tokens = 5;
  c.steps = 2;
  c.timeline = true;
  c.collect_params = true;
  c.separate_rs_group = true;
  return c;
}

std::vector<runtime::RankResult> run_chaos(uint64_t seed) {
  CpuOptions o = virtual_time();
  o.chaos = true;
  o.chaos_seed = seed;
  o.chaos_max_us = 100;
  return testing::run_fsdp(2, chaos_config(), o);
}

// The delays are simulated: a seed gives the same timeline to the last bit on every run (a
// schedule bug that one seed shows, it shows every time), another seed another timeline,
// and every one of them the reference's parameters.
TEST(CpuVirtualClock, ChaosDelaysAreSimulatedAndReproducible) {
  const auto ref = testing::run_reference(chaos_config(), 2);
  const auto a = run_chaos(7), again = run_chaos(7), b = run_chaos(8);
  CpuOptions calm_options = virtual_time();
  const auto calm = testing::run_fsdp(2, chaos_config(), calm_options);
  for (int r : {0, 1}) {
    EXPECT_EQ(sorted_ops(a[r].timeline), sorted_ops(again[r].timeline)) << "rank " << r;
    EXPECT_NE(sorted_ops(a[r].timeline), sorted_ops(b[r].timeline)) << "rank " << r;
    for (const auto* run : {&a, &b}) {
      EXPECT_LE(testing::relative_error((*run)[r].params, ref.params), 1e-6);
      // Without chaos nothing takes time; with it, the delays add up to simulated time.
      EXPECT_GT(last_end_us((*run)[r].timeline), 0.0);
    }
    EXPECT_EQ(last_end_us(calm[r].timeline), 0.0);
  }
}

}  // namespace
}  // namespace fsdp::cpu
