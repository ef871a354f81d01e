// Metrics against values computed by hand, on the CPU backend with forced durations: compute
// is SpinBlocks (known forward/backward times) and communication goes over a simulated link
// (every all-gather and reduce-scatter of a block takes a known time). Time is the virtual
// clock's (Note [Virtual clock]), so the values are exact on any machine under any load.
#include <gtest/gtest.h>

#include "runtime/trace_metrics.h"
#include "../test_util.h"

namespace fsdp::testing {
namespace {

// 4 blocks with a 64 x 64 fp32 weight on 2 ranks: a rank receives 8 KiB per all-gather or
// reduce-scatter, which takes kComm at the link speed below.
constexpr double kComm = 10000, kForward = 15000, kBackward = 2500;  // microseconds
constexpr int kLayers = 4;
// Simulated times are exact sums of these durations; only the doubles' rounding is left.
constexpr double kExact = 1e-6;  // ms

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

// Rank 0's metrics per recorded step; the schedule is symmetric, so rank 1's must be the
// same to the last bit of simulated time.
runtime::TimelineMetrics metrics(const runtime::TrainConfig& c) {
  cpu::CpuOptions o;
  o.link_gbps = 8192.0 / kComm / 1e3;  // 8 KiB in kComm microseconds
  o.virtual_clock = true;
  const auto ranks = run_fsdp(2, c, o);
  std::vector<runtime::TimelineMetrics> m;
  for (const auto& r : ranks) {
    const Timeline& t = r.timeline;
    m.push_back(runtime::compute_metrics(t, runtime::find_stream(t, "compute"), c.steps - c.warmup));
  }
  EXPECT_NEAR(m[1].exposed_comm_ms, m[0].exposed_comm_ms, kExact);
  EXPECT_NEAR(m[1].exposed_ag_ms, m[0].exposed_ag_ms, kExact);
  EXPECT_NEAR(m[1].rs_recycle_stall_ms, m[0].rs_recycle_stall_ms, kExact);
  EXPECT_NEAR(m[1].rs_drain_ms, m[0].rs_drain_ms, kExact);
  EXPECT_NEAR(m[1].ag_rs_overlap_ms, m[0].ag_rs_overlap_ms, kExact);
  return m[0];
}

constexpr double ms(double us) { return us / 1e3; }

// Per step, k = 1, no backward all-gathers (reshard_after_forward off), C = kComm,
// B = kBackward:
//  - forward: the first all-gather is exposed (C); the next ones run under the forward spins;
//  - backward: each block's RS (C) starts after its copy-in, the next block computes for B,
//    then its copy-in must reclaim that buffer: a stall of C - B for blocks 2, 1, 0; the
//    finalize drains the last RS: C.
TEST(TraceForced, ExposedCommAndRecycleStallMatchHandComputedValues) {
  const runtime::TimelineMetrics m = metrics(forced(1, false, false));
  const double ag = ms(kComm), recycle = ms((kLayers - 1) * (kComm - kBackward)),
               drain = ms(kComm);
  EXPECT_NEAR(m.exposed_ag_ms, ag, kExact);              // 10 ms
  EXPECT_NEAR(m.rs_recycle_stall_ms, recycle, kExact);   // 22.5 ms
  EXPECT_NEAR(m.rs_drain_ms, drain, kExact);             // 10 ms
  EXPECT_NEAR(m.exposed_comm_ms, ag + recycle + drain, kExact);  // 42.5 ms
  EXPECT_NEAR(m.ag_rs_overlap_ms, 0.0, kExact);          // no backward all-gathers
}

// k = 2 lets block i's copy-in skip the wait for RS(i+1); the RS stream still runs the
// reduce-scatters back to back, so the stall moves to the drain. Block 1 waits for RS(3)
// (done at C, block 1 arrives at 2B): C - 2B; block 0 waits for RS(2) (done at 2C, arrives
// at C + B): C - B; the drain waits for RS(1) and RS(0), from 2C to 4C.
TEST(TraceForced, TwoBuffersShrinkTheRecycleStall) {
  const runtime::TimelineMetrics k2 = metrics(forced(2, false, false));
  const double recycle = ms(2 * kComm - 3 * kBackward), drain = ms(2 * kComm);
  EXPECT_NEAR(k2.rs_recycle_stall_ms, recycle, kExact);  // 12.5 ms, against 22.5 for k = 1
  EXPECT_NEAR(k2.rs_drain_ms, drain, kExact);            // 20 ms
  EXPECT_NEAR(k2.exposed_ag_ms, ms(kComm), kExact);      // 10 ms
  EXPECT_NEAR(k2.exposed_comm_ms, ms(kComm) + recycle + drain, kExact);  // 42.5 ms
}

// With backward all-gathers (reshard on). Note [All-gather ordering]: an all-gather waits
// until the module before it began computing, and a module's backward re-gather also waits
// for its own forward free. Forward is as without backward all-gathers (C exposed). The
// forward ends at C + 4F; then, per step:
//  - block 3's re-gather waits for block 3's forward free, at the forward's end, and nothing
//    (no head here) hides it: C exposed;
//  - on its own communicator: blocks 2, 1, 0 each wait C - B for their all-gather (issued when
//    the block after began its backward, which takes B). Each RS then finds its ring buffer
//    free (no recycle stall), and overlaps the next two all-gathers for C - B and B, except
//    RS(1), which has only AG(0) left: 3C - B of overlap; the finalize drains RS(0): C;
//  - on the shared one, collectives run in issue order: RS(3) runs after AG(2), AG(1) after
//    RS(3) and AG(0) after RS(2), so block 2 waits C - B for its all-gather and blocks 1, 0 a
//    whole C; each copy-in waits C - B for the RS before; nothing overlaps.
TEST(TraceForced, SeparateGroupOverlapsAgAndRsSharedNever) {
  const runtime::TimelineMetrics separate = metrics(forced(1, true, true));
  const double drain = ms(kComm);
  EXPECT_NEAR(separate.ag_rs_overlap_ms, ms(3 * kComm - kBackward), kExact);         // 27.5
  EXPECT_NEAR(separate.exposed_ag_ms, ms(2 * kComm + 3 * (kComm - kBackward)), kExact);  // 42.5
  EXPECT_NEAR(separate.rs_recycle_stall_ms, 0.0, kExact);
  EXPECT_NEAR(separate.rs_drain_ms, drain, kExact);                                     // 10

  const runtime::TimelineMetrics shared = metrics(forced(1, true, false));
  const double recycle = ms((kLayers - 1) * (kComm - kBackward));
  EXPECT_NEAR(shared.ag_rs_overlap_ms, 0.0, kExact);
  EXPECT_NEAR(shared.exposed_ag_ms, ms(5 * kComm - kBackward), kExact);  // 47.5
  EXPECT_NEAR(shared.rs_recycle_stall_ms, recycle, kExact);              // 22.5
  EXPECT_NEAR(shared.rs_drain_ms, drain, kExact);                        // 10
  EXPECT_NEAR(shared.exposed_comm_ms, ms(5 * kComm - kBackward) + recycle + drain, kExact);  // 80
}

}  // namespace
}  // namespace fsdp::testing
