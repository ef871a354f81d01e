// Metrics against values computed by hand, on the CPU backend with forced durations: compute
// is SpinBlocks (known forward/backward times) and communication goes over a simulated link
// (every all-gather and reduce-scatter of a block takes a known time).
#include <gtest/gtest.h>

#include "runtime/trace_metrics.h"
#include "../test_util.h"

namespace fsdp::testing {
namespace {

// 4 blocks with a 64 x 64 fp32 weight on 2 ranks: a rank receives 8 KiB per all-gather or
// reduce-scatter, which takes kComm at the link speed below.
// Long enough that thread wake-up latency on a loaded 2-core machine stays within the 10%.
constexpr double kComm = 10000, kForward = 15000, kBackward = 2500;  // microseconds
constexpr int kLayers = 4;

runtime::TrainConfig forced(int k, bool reshard_after_forward, bool separate) {
  runtime::TrainConfig c;
  c.model.kind = "spin";
  c.model.layers = kLayers;
  c.model.dim = 64;
  c.model.spin_forward_us = kForward;
  c.model.spin_backward_us = kBackward;
  c.tokens = 2;
  c.steps = 3;
  c.warmup = 1;
  c.timeline = true;
  c.rs_max_input_buffers = k;
  c.reshard_after_forward = reshard_after_forward;
  c.separate_rs_group = separate;
  return c;
}

// The mean over the two ranks: the schedule is symmetric, and when one rank's thread is late
// its stalls shrink by what the other's grow (a collective waits for both).
runtime::TimelineMetrics metrics(const runtime::TrainConfig& c) {
  cpu::CpuOptions o;
  o.link_gbps = 8192.0 / kComm / 1e3;  // 8 KiB in kComm microseconds
  const auto ranks = run_fsdp(2, c, o);
  runtime::TimelineMetrics mean;
  for (const auto& r : ranks) {
    const Timeline& t = r.timeline;
    const runtime::TimelineMetrics m =
        runtime::compute_metrics(t, runtime::find_stream(t, "compute"), c.steps - c.warmup);
    mean.exposed_comm_ms += m.exposed_comm_ms / ranks.size();
    mean.exposed_ag_ms += m.exposed_ag_ms / ranks.size();
    mean.rs_recycle_stall_ms += m.rs_recycle_stall_ms / ranks.size();
    mean.rs_drain_ms += m.rs_drain_ms / ranks.size();
    mean.ag_rs_overlap_ms += m.ag_rs_overlap_ms / ranks.size();
  }
  return mean;
}

// Per step, k = 1, no backward all-gathers (reshard_after_forward off):
//  - forward: the first all-gather is exposed (kComm); the next ones run under the 6 ms spins;
//  - backward: each block's RS (kComm) starts after its copy-in, the next block computes for
//    kBackward, then its copy-in must reclaim that buffer: a stall of kComm - kBackward for
//    blocks 2, 1, 0; the finalize drains the last RS: kComm.
TEST(TraceForced, ExposedCommAndRecycleStallMatchHandComputedValues) {
  const runtime::TimelineMetrics m = metrics(forced(1, false, false));
  const double ag = kComm / 1e3, recycle = (kLayers - 1) * (kComm - kBackward) / 1e3,
               drain = kComm / 1e3;
  EXPECT_NEAR(m.exposed_ag_ms, ag, 0.1 * ag);
  EXPECT_NEAR(m.rs_recycle_stall_ms, recycle, 0.1 * recycle);
  EXPECT_NEAR(m.rs_drain_ms, drain, 0.1 * drain);
  EXPECT_NEAR(m.exposed_comm_ms, ag + recycle + drain, 0.1 * (ag + recycle + drain));
}

// k = 2 lets block i's copy-in skip the wait for RS(i+1); the RS stream still runs the
// reduce-scatters back to back, so the stall moves to the drain. With C = kComm, B = kBackward:
// block 1 waits for RS(3) (done at C, block 1 arrives at 2B): C - 2B; block 0 waits for RS(2)
// (done at 2C, arrives at C + B): C - B; the drain waits for RS(1) and RS(0), from 2C to 4C.
TEST(TraceForced, TwoBuffersShrinkTheRecycleStall) {
  const runtime::TimelineMetrics k1 = metrics(forced(1, false, false));
  const runtime::TimelineMetrics k2 = metrics(forced(2, false, false));
  const double recycle = (2 * kComm - 3 * kBackward) / 1e3, drain = 2 * kComm / 1e3;
  EXPECT_NEAR(k2.rs_recycle_stall_ms, recycle, 0.1 * recycle);
  EXPECT_NEAR(k2.rs_drain_ms, drain, 0.1 * drain);
  EXPECT_LT(k2.rs_recycle_stall_ms, 0.8 * k1.rs_recycle_stall_ms);
}

// With backward all-gathers (reshard on), AG(i-1) is prefetched before block i's backward and
// takes kComm, so RS(i) starts while it runs: on its own communicator they overlap; on the
// shared one, never.
TEST(TraceForced, SeparateGroupOverlapsAgAndRsSharedNever) {
  EXPECT_GT(metrics(forced(1, true, true)).ag_rs_overlap_ms, 0.25 * kComm / 1e3);
  EXPECT_EQ(metrics(forced(1, true, false)).ag_rs_overlap_ms, 0.0);
}

}  // namespace
}  // namespace fsdp::testing
