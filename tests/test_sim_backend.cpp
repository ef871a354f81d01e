// The simulation backend (Note [Simulation backend]) against hand-computed times: one GEMM,
// one collective, overlapping collectives on a shared link, a stall, the RS recycle stall of
// the virtual-clock timing tests, memory counted exactly as the CPU backend counts it, and a
// 1024-GPU 70B-shape step. Every time is the virtual clock's, so the values are exact.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/sim/sim_backend.h"
#include "backend/sim/sim_comm.h"
#include "fsdp/error.h"
#include "runtime/launch_sim.h"
#include "runtime/trace_metrics.h"
#include "test_util.h"

namespace fsdp::sim {
namespace {

constexpr double kExact = 1e-6;  // us

SimOptions ideal(int gpus, int per_node, double tflops = 100, double memory_gbps = 1000,
                 double link_gbps = 100) {
  SimOptions o;
  o.gpus = gpus;
  o.gpus_per_node = per_node;
  o.calibration = ideal_calibration(memory_gbps, tflops, link_gbps);
  return o;
}

const TimelineOp& op_named(const Timeline& tl, const std::string& label) {
  for (const auto& op : tl.ops)
    if (op.label == label) return op;
  throw Error("no op labelled " + label);
}
double length(const TimelineOp& op) { return op.end_us - op.start_us; }

// A GEMM takes its flops at the calibrated rate: 2 m n k / (100 TFLOP/s). A measured shape
// takes its measured time, and a shape near it the same efficiency.
TEST(SimBackend, OneGemmTakesItsFlopsAtTheCalibratedRate) {
  SimOptions o = ideal(1, 1);
  o.calibration.gemms.push_back({DType::BF16, 4096, 4096, 4096, 1, 1000.0});
  SimWorld world(o);
  auto dev = world.make_device();
  Stream s = dev->create_stream("compute", StreamPriority::Normal);
  void* a = dev->alloc(1 << 20, s, MemTag::Other);
  dev->enable_timeline(true);
  dev->set_label("untabled");
  dev->gemm(s, false, true, 1024, 2048, 4096, 1, a, a, DType::F32, 0, a, DType::F32);
  dev->set_label("tabled");
  dev->gemm(s, false, true, 4096, 4096, 4096, 1, a, a, DType::BF16, 0, a, DType::BF16);
  dev->set_label("near");
  dev->gemm(s, false, true, 2048, 4096, 4096, 1, a, a, DType::BF16, 0, a, DType::BF16);
  const Timeline tl = dev->take_timeline();
  EXPECT_NEAR(length(op_named(tl, "untabled")), 2.0 * 1024 * 2048 * 4096 / 1e8, kExact);  // 171.8
  EXPECT_NEAR(length(op_named(tl, "tabled")), 1000.0, kExact);
  EXPECT_NEAR(length(op_named(tl, "near")), 500.0, kExact);
  EXPECT_NEAR(dev->now_us(), 2.0 * 1024 * 2048 * 4096 / 1e8 + 1500.0, kExact);
  EXPECT_NEAR(world.flops_done(), 2.0 * 4096 * 4096 * (512 + 4096 + 2048), 1.0);
  dev->free(a, s);
}

// A grouped GEMM is one kernel: its groups' times at the calibrated rate add up, less the
// kernel minimum each would pay alone, times the layout's grouped factor, plus one minimum.
// Here 2 groups of 2 x 1024 x 2048 x 4096 flops at 100 TFLOP/s (171.8 us each), factor 2 for
// "nt", a 3 us minimum: 2 x 2 x 171.8 - 2 x 2 x 3 + 3 us. An "nn" group has factor 1.
TEST(SimBackend, AGroupedGemmTakesItsGroupsTimesAtTheGroupedFactor) {
  SimOptions o = ideal(1, 1);
  o.calibration.kernel_min_us = 3;
  o.calibration.grouped_gemm_factor[1] = 2.0;  // nt
  SimWorld world(o);
  auto dev = world.make_device();
  Stream s = dev->create_stream("compute", StreamPriority::Normal);
  void* a = dev->alloc(1 << 20, s, MemTag::Other);
  dev->enable_timeline(true);
  const Device::GemmGroup groups[3] = {{1024, 2048, 4096, a, a, a}, {0, 2048, 4096, a, a, a},
                                       {1024, 2048, 4096, a, a, a}};
  dev->set_label("grouped nt");
  dev->grouped_gemm(s, false, true, groups, 3, DType::BF16, DType::BF16);
  dev->set_label("grouped nn");
  dev->grouped_gemm(s, false, false, groups, 3, DType::BF16, DType::BF16);
  const Timeline tl = dev->take_timeline();
  const double one = 2.0 * 1024 * 2048 * 4096 / 1e8;
  EXPECT_NEAR(length(op_named(tl, "grouped nt")), 2.0 * (2 * one - 2 * 3.0) + 3.0, kExact);
  EXPECT_NEAR(length(op_named(tl, "grouped nn")), 2 * one - 2 * 3.0 + 3.0, kExact);
  EXPECT_NEAR(world.flops_done(), 2 * 2 * 2.0 * 1024 * 2048 * 4096, 1.0);
  const Calibration c = parse_calibration(R"({"format": "fsdp-sim-calibration", "version": 1,
    "peak_tflops": 989, "host": {"kernel_launch_us": 0, "gemm_launch_us": 0, "collective_launch_us": 0},
    "kernel_min_us": 0, "memory_kernel_sharing": 2, "memory_kernel_yield": 5,
    "memory_kernel_lead": 0.25, "memory": {"gbps": 4000, "host_copy_gbps": 25},
    "gemm": {"default_tflops": {"bf16": 700}, "grouped_factor": {"tn": 1.5}},
    "attention": {"default_tflops_forward": 300, "default_tflops_backward": 250},
    "links": {"nvlink": {"latency_us": 5, "busbw_gbps": [[1, 100]]},
              "network": {"latency_us": 10, "busbw_gbps": [[1, 40]]}}})", "c.json");
  EXPECT_EQ(c.grouped_gemm_factor[2], 1.5);
  EXPECT_EQ(c.grouped_gemm_factor[1], 1.0);
  EXPECT_EQ(c.memory_kernel_sharing, 2.0);
  EXPECT_EQ(c.memory_kernel_yield, 5.0);
  EXPECT_EQ(c.memory_kernel_lead, 0.25);
  dev->free(a, s);
}

// 16 GPUs on 2 nodes, an all-gather of 1 Mi bf16 elements per rank (32 MiB in all): each
// member passes 15/16 of it on; the half that comes from the other node comes through the
// node's 8 NICs (1/16 of the message each), the rest over NVLink, at once; the ring's latency
// is 14 NVLink steps and 1 network step.
TEST(SimBackend, OneCollectiveTakesTheRingModelsTime) {
  SimOptions o = ideal(16, 8);
  o.calibration.nvlink = {0.0, 1.0, {{1.0, 100.0}}};  // 1 us a step, 100 GB/s
  o.calibration.network = {0.0, 10.0, {{1.0, 10.0}}};
  SimWorld world(o);
  auto dev = world.make_device();
  auto comm = world.make_world_comm(*dev);
  EXPECT_EQ(comm->size(), 16);
  EXPECT_EQ(comm->rank(), 15);
  Stream s = dev->create_stream("all-gather", StreamPriority::High);
  const int64_t count = 1 << 20;
  void* recv = dev->alloc(16 * count * 2, s, MemTag::AllGather);
  dev->enable_timeline(true);
  dev->set_label("AG");
  comm->all_gather(static_cast<char*>(recv) + 15 * count * 2, recv, count, DType::BF16, s);
  const Timeline tl = dev->take_timeline();
  const double bytes = 32.0 * (1 << 20), net = bytes / 2 / 8, nvl = bytes * 15 / 16 - net;
  const double expected = 14 * 1.0 + 1 * 10.0 + std::max(nvl / 1e5, net / 1e4);  // 317.6
  EXPECT_NEAR(length(op_named(tl, "AG")), expected, kExact);
  EXPECT_EQ(comm->issued(CollectiveKind::AllGather), 1);
  dev->free(recv, s);
}

// Two all-gathers at once: on one communicator they run one after the other (T, then 2T);
// on two communicators over the same NVLink they share it and both end at 2T; over NVLink and
// over the network they do not slow each other.
TEST(SimBackend, OverlappingCollectivesShareTheirLink) {
  SimWorld world(ideal(16, 8));
  auto dev = world.make_device();
  auto comm = world.make_world_comm(*dev);
  auto node = comm->split_groups(8, 1, "node");      // ranks 8..15: NVLink
  auto across = comm->split_groups(2, 8, "across");  // ranks 7, 15: the network
  ASSERT_EQ(node->world_ranks(), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  ASSERT_EQ(across->world_ranks(), (std::vector<int>{7, 15}));
  Stream a = dev->create_stream("a", StreamPriority::High);
  Stream b = dev->create_stream("b", StreamPriority::High);
  const int64_t count = 1 << 20;  // fp32: 4 MiB per member
  void* buf = dev->alloc(8 * count * 4, a, MemTag::AllGather);
  void* buf2 = dev->alloc(8 * count * 4, b, MemTag::AllGather);
  const double t_node = 7.0 / 8 * 8 * count * 4 / 1e5;  // 7/8 of 32 MiB at 100 GB/s
  const double t_across = 1.0 / 2 * 2 * count * 4 / 1e5;
  auto run = [&](Comm& first, Comm& second) {
    dev->enable_timeline(true);
    const double t0 = dev->now_us();
    dev->set_label("first");
    first.all_gather(buf, buf, count, DType::F32, a);
    dev->set_label("second");
    second.all_gather(buf2, buf2, count, DType::F32, b);
    Timeline tl = dev->take_timeline();
    for (auto& op : tl.ops) op.start_us -= t0, op.end_us -= t0;
    return tl;
  };
  Timeline same = run(*node, *node);
  EXPECT_NEAR(op_named(same, "first").end_us, t_node, kExact);
  EXPECT_NEAR(op_named(same, "second").start_us, t_node, kExact);
  EXPECT_NEAR(op_named(same, "second").end_us, 2 * t_node, kExact);
  auto node2 = comm->split_groups(8, 1, "node2");
  Timeline shared = run(*node, *node2);
  EXPECT_NEAR(op_named(shared, "first").end_us, 2 * t_node, kExact);
  EXPECT_NEAR(op_named(shared, "second").end_us, 2 * t_node, kExact);
  Timeline apart = run(*node, *across);
  EXPECT_NEAR(op_named(apart, "first").end_us, t_node, kExact);
  EXPECT_NEAR(op_named(apart, "second").end_us, t_across, kExact);
  dev->free(buf, a);
  dev->free(buf2, b);
}

// One simulated GPU (100 TFLOP/s, 1000 GB/s) with a normal- and a high-priority stream, a
// scratch buffer and the timeline on, for the sharing cases below; `gemm` takes 1000 us alone
// (2 x 1000 x 1000 x 50000 flops at 1e8 a us) and `copy` 200 us (2 x 100 MB at 1000 GB/s).
struct TwoStreams {
  explicit TwoStreams(const SimOptions& o) : world(o), dev(world.make_device()) {
    normal = dev->create_stream("normal", StreamPriority::Normal);
    high = dev->create_stream("high", StreamPriority::High);
    buf = dev->alloc(1 << 20, normal, MemTag::Other);
    dev->enable_timeline(true);
  }
  ~TwoStreams() { dev->free(buf, normal); }
  void gemm(Stream s, const char* label) {
    dev->set_label(label);
    dev->gemm(s, false, true, 1000, 1000, 50000, 1, buf, buf, DType::BF16, 0, buf, DType::BF16);
  }
  void copy(Stream s, const char* label) {
    dev->set_label(label);
    dev->copy(s, buf, buf, 100000000);
  }
  SimWorld world;
  std::unique_ptr<Device> dev;
  Stream normal, high;
  void* buf = nullptr;
};

SimOptions sharing_options(double kernel_sharing, double memory_sharing = -1) {
  SimOptions o = ideal(1, 1, 100, 1000);
  o.calibration.kernel_sharing = kernel_sharing;
  o.calibration.memory_kernel_sharing = memory_sharing;
  return o;
}

// Kernels of two streams that overlap share the device (Note [Shared channels]): at sharing 1
// a 200 us kernel beside a 1000 us one ends at 400 and the long one at 1200; at 0.5 each runs
// at 2/3 while both do, so 300 and 1100. A spin (a forced duration) shares nothing.
TEST(SimBackend, OverlappingKernelsShareTheDevice) {
  for (double sharing : {1.0, 0.5}) {
    TwoStreams t(sharing_options(sharing));
    t.gemm(t.normal, "gemm");
    t.copy(t.high, "copy");
    t.dev->set_label("spin");
    t.dev->spin(t.high, 50);
    const Timeline tl = t.dev->take_timeline();
    const double t_short = sharing == 1.0 ? 400 : 300, t_long = sharing == 1.0 ? 1200 : 1100;
    EXPECT_NEAR(op_named(tl, "copy").end_us, t_short, kExact) << sharing;
    EXPECT_NEAR(op_named(tl, "gemm").end_us, t_long, kExact) << sharing;
    EXPECT_NEAR(length(op_named(tl, "spin")), 50, kExact) << sharing;
  }
}

// A memory-bound kernel brings its own share factor (memory_kernel_sharing): at 3, with the
// GEMM's at 0, the 200 us copy beside the 1000 us GEMM runs at 1 / (1 + 3) and ends at 800 us,
// and the GEMM keeps its full speed and ends at 1000 us.
TEST(SimBackend, AMemoryBoundKernelSharesAtItsOwnFactor) {
  TwoStreams t(sharing_options(0, 3));
  t.gemm(t.normal, "gemm");
  t.copy(t.high, "copy");
  const Timeline tl = t.dev->take_timeline();
  EXPECT_NEAR(op_named(tl, "copy").end_us, 800, kExact);
  EXPECT_NEAR(op_named(tl, "gemm").end_us, 1000, kExact);
}

// Memory-bound kernels share by their streams' priorities (memory_kernel_yield and _lead):
// two 200 us copies start together, one on a normal and one on a high-priority stream, at
// memory_kernel_sharing 1.
//  - yield 3: the high one runs at 1 / 2 (the normal one adds 1 to it), the normal one at 1 / 4,
//    so the high one ends at 400 us, when the normal one has done 100 us, which it then does
//    alone by 500 us;
//  - yield 3 and lead 0: the high one runs at full speed and ends at 200 us, the normal one has
//    done 50 us by then and ends at 350 us;
//  - neither given: an even split, both end at 400 us.
// A GEMM on the normal stream after its copy shares nothing (kernel_sharing 0): memory-bound
// kernels only.
TEST(SimBackend, MemoryBoundKernelsShareByTheirStreamsPriorities) {
  struct Case {
    double yield, lead, high_end, normal_end;
  };
  for (const Case& c : {Case{3, -1, 400, 500}, Case{3, 0, 200, 350}, Case{-1, -1, 400, 400}}) {
    SimOptions o = sharing_options(0, 1);
    o.calibration.memory_kernel_yield = c.yield;
    o.calibration.memory_kernel_lead = c.lead;
    TwoStreams t(o);
    t.copy(t.normal, "normal copy");
    t.copy(t.high, "high copy");
    t.gemm(t.normal, "gemm");
    const Timeline tl = t.dev->take_timeline();
    EXPECT_NEAR(op_named(tl, "high copy").end_us, c.high_end, kExact) << c.yield << " " << c.lead;
    EXPECT_NEAR(op_named(tl, "normal copy").end_us, c.normal_end, kExact) << c.yield << " " << c.lead;
    EXPECT_NEAR(op_named(tl, "gemm").end_us, c.normal_end + 1000, kExact) << c.yield << " " << c.lead;
  }
}

// Compute waits for an all-gather that ends after its own work: the wait is the difference.
TEST(SimBackend, AComputeStreamStallsForTheCollectiveItWaitsOn) {
  SimWorld world(ideal(2, 8));
  auto dev = world.make_device();
  auto comm = world.make_world_comm(*dev);
  Stream compute = dev->create_stream("compute", StreamPriority::Normal);
  Stream ag = dev->create_stream("all-gather", StreamPriority::High);
  const int64_t count = 5 << 20;  // fp32: a member receives 20 MiB, 209.7152 us at 100 GB/s
  void* buf = dev->alloc(2 * count * 4, ag, MemTag::AllGather);
  Event done = dev->create_event();
  dev->enable_timeline(true);
  dev->set_label("AG x");
  comm->all_gather(buf, buf, count, DType::F32, ag);
  dev->record_event(done, ag);
  dev->set_label("work");
  dev->spin(compute, 100);
  dev->set_label("wait");
  dev->wait_event(compute, done);
  const Timeline tl = dev->take_timeline();
  const double t_ag = count * 4.0 / 1e5;
  const TimelineOp& wait = op_named(tl, "wait");
  EXPECT_EQ(wait.kind, OpKind::Wait);
  EXPECT_EQ(wait.waited_for, "AG x");
  EXPECT_NEAR(wait.start_us, 100, kExact);
  EXPECT_NEAR(wait.end_us, t_ag, kExact);
  dev->destroy_event(done);
  dev->free(buf, ag);
}

// The engine's schedule on the simulated link: tests/timing's ExposedCommAndRecycleStall
// case (4 spin blocks, k = 1, no backward all-gathers, 2 ranks), with the link of that test:
// 8 KiB from the peer in kComm. The same hand-computed metrics come out.
TEST(SimBackend, TheRecycleStallOfTheTimingTests) {
  constexpr double kComm = 10000, kForward = 15000, kBackward = 2500;
  constexpr int kLayers = 4;
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
  c.reshard_after_forward = false;
  SimWorld world(ideal(2, 8, 100, 1e9, 8192.0 / kComm / 1e3));
  const runtime::RankResult r = runtime::run_simulated_training(world, c);
  const runtime::TimelineMetrics m = runtime::compute_metrics(
      r.timeline, runtime::find_stream(r.timeline, "compute"), c.steps - c.warmup);
  auto ms = [](double us) { return us / 1e3; };
  EXPECT_NEAR(m.exposed_ag_ms, ms(kComm), 1e-6);
  EXPECT_NEAR(m.rs_recycle_stall_ms, ms((kLayers - 1) * (kComm - kBackward)), 1e-6);
  EXPECT_NEAR(m.rs_drain_ms, ms(kComm), 1e-6);
  EXPECT_NEAR(m.ag_rs_overlap_ms, 0.0, 1e-6);
}

// Memory is counted at call time by the same ledger as the CPU backend's, so a simulated run
// peaks exactly where the CPU ranks do, tag by tag, and the ring never holds more than k RS
// inputs.
TEST(SimBackend, MemoryIsCountedExactlyAsOnTheCpuBackend) {
  runtime::TrainConfig c;
  c.model.kind = "mlp";
  c.model.layers = 4;
  c.model.dim = 64;
  c.tokens = 16;
  c.steps = 2;
  c.rs_max_input_buffers = 2;
  const auto cpu = testing::run_fsdp(4, c);
  SimWorld world(ideal(4, 8));
  const runtime::RankResult sim = runtime::run_simulated_training(world, c);
  EXPECT_EQ(sim.memory.peak_bytes, cpu.back().memory.peak_bytes);
  for (int t = 0; t < kMemTagCount; ++t) {
    EXPECT_EQ(sim.memory.tag_peak_bytes[t], cpu.back().memory.tag_peak_bytes[t]) << mem_tag_name(static_cast<MemTag>(t));
    EXPECT_EQ(sim.memory.tag_peak_live[t], cpu.back().memory.tag_peak_live[t]) << mem_tag_name(static_cast<MemTag>(t));
  }
  EXPECT_EQ(sim.memory.tag_peak_live[static_cast<int>(MemTag::RsInput)], 2);
  EXPECT_EQ(sim.memory.current_bytes, cpu.back().memory.current_bytes);
}

// Llama-3.1-70B's shape (80 layers, dim 8192, 64 heads, 8 KV heads, FFN 28672, vocab 128256)
// on 1024 GPUs, 128 nodes: one step simulates (in well under a second here, with no tensor
// memory), and the sharded state per rank is the params' 16 bytes (fp32 param, grad, AdamW's
// two states) over 1024 ranks, padding aside.
TEST(SimBackend, A1024GpuStepOfThe70BShapeSimulates) {
  runtime::TrainConfig c;
  c.model.kind = "transformer";
  c.model.layers = 80;
  c.model.dim = 8192;
  c.model.heads = 64;
  c.model.kv_heads = 8;
  c.model.ffn_dim = 28672;
  c.model.vocab = 128256;
  c.model.seq_len = 2048;
  c.tokens = 2048;
  c.steps = 2;
  c.warmup = 1;
  c.timeline = true;
  c.param_dtype = DType::BF16;
  SimOptions o = ideal(1024, 8, 700, 3000, 200);
  o.calibration.network.busbw = {{1.0, 40.0}};
  SimWorld world(o);
  const runtime::RankResult r = runtime::run_simulated_training(world, c);
  EXPECT_EQ(r.rank, 1023);
  EXPECT_GT(r.param_count, 70'000'000'000);
  const double expected = 16.0 * static_cast<double>(r.param_count) / 1024;
  const double state = static_cast<double>(r.memory.tag_peak_bytes[static_cast<int>(MemTag::ShardedState)]);
  EXPECT_GE(state, expected);
  EXPECT_LE(state, expected * 1.01);
  // A step's GEMMs alone take 6 x params x tokens / 700 TFLOP/s.
  EXPECT_GT(world.flops_done(), 6.0 * static_cast<double>(r.param_count) * c.tokens * c.steps);
}

// The dropless MoE routing runs on the host from the probabilities the load model draws (Note
// [Simulated values]), and the all-to-all's counts follow from them: with the busiest expert
// (on the simulated rank) getting half the assignments, the rank's experts have more rows to
// run and to receive than balanced, so its step takes longer.
TEST(SimBackend, TheMoeLoadModelPacesTheStep) {
  runtime::TrainConfig c;
  c.model.kind = "moe-transformer";
  c.model.layers = 2;
  c.model.dim = 256;
  c.model.heads = 4;
  c.model.experts = 8;
  c.model.top_k = 2;
  c.model.ep = 4;
  c.model.seq_len = 256;
  c.model.vocab = 256;
  c.model.capacity_factor = 0;
  c.tokens = 4096;
  c.steps = 2;
  c.warmup = 1;
  c.timeline = true;
  auto step_us = [&](MoeLoad load) {
    SimOptions o = ideal(8, 8, 1, 1000, 100);  // slow GEMMs: the experts' rows show
    o.moe_load = load;
    SimWorld world(o);
    const runtime::RankResult r = runtime::run_simulated_training(world, c);
    double first = 1e300, last = 0;
    for (const TimelineOp& op : r.timeline.ops) {
      first = std::min(first, op.start_us);
      last = std::max(last, op.end_us);
    }
    return last - first;
  };
  const double balanced = step_us({});
  const double skewed = step_us({true, 0.5, 2});
  EXPECT_GT(skewed, 1.4 * balanced) << balanced << " vs " << skewed;
}

// A plain split by color: groups of size() / (color + 1), consecutive, or every (color + 1)-th
// member after a consecutive split into groups of color + 1 (Note [Simulated splits]).
TEST(SimBackend, PlainSplitsAreReadAsEqualGroups) {
  SimWorld world(ideal(16, 8));
  auto dev = world.make_device();
  auto comm = world.make_world_comm(*dev);
  auto whole = comm->split(0, comm->rank(), "whole");
  EXPECT_EQ(whole->size(), 16);
  auto halves = comm->split(comm->rank() / 8, comm->rank(), "halves");
  EXPECT_EQ(halves->world_ranks(), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  auto ep = comm->split_groups(4, 1, "ep");
  EXPECT_EQ(ep->world_ranks(), (std::vector<int>{12, 13, 14, 15}));
  auto experts = comm->split(comm->rank() % 4, comm->rank(), "experts");
  EXPECT_EQ(experts->world_ranks(), (std::vector<int>{3, 7, 11, 15}));
  EXPECT_EQ(comm->split(-1, 0, "none"), nullptr);
  try {
    comm->split(4, comm->rank(), "fives");  // 5 groups of 16 members
    ADD_FAILURE() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("equal groups"), std::string::npos) << e.what();
  }
}

TEST(SimBackend, BadCalibrationFilesFailInOneLineNamingTheKey) {
  auto error_of = [](const std::string& text) {
    try {
      parse_calibration(text, "c.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("{").find("calibration file 'c.json': is not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("[]").find("must be an object"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": "x"})").find("'format' must be \"fsdp-sim-calibration\""),
            std::string::npos);
  const std::string good = R"({"format": "fsdp-sim-calibration", "version": 1, "peak_tflops": 989,
    "host": {"kernel_launch_us": 5, "gemm_launch_us": 10, "collective_launch_us": 6},
    "kernel_min_us": 2, "memory": {"gbps": 4000, "host_copy_gbps": 25},
    "gemm": {"default_tflops": {"bf16": 700}, "table": [
      {"dtype": "bf16", "m": 8192, "n": 2560, "k": 2048, "layout": "nt", "us": 116.8}]},
    "attention": {"default_tflops_forward": 300, "default_tflops_backward": 250},
    "links": {"nvlink": {"latency_us": 5, "busbw_gbps": [[1048576, 100], [67108864, 180]]},
              "network": {"latency_us": 10, "busbw_gbps": [[1, 40]]}}})";
  const Calibration c = parse_calibration(good, "c.json");
  EXPECT_EQ(c.gemms.size(), 1u);
  EXPECT_NEAR(c.nvlink.gbps(std::sqrt(1048576.0 * 67108864.0)), 140.0, 1e-9);  // log-linear
  std::string bad = good;
  bad.replace(bad.find("116.8"), 5, "-1");
  EXPECT_NE(error_of(bad).find("'gemm.table[0].us' must be > 0"), std::string::npos) << error_of(bad);
  bad = good;
  bad.replace(bad.find("\"nt\""), 4, "\"xy\"");
  EXPECT_NE(error_of(bad).find("'gemm.table[0].layout' must be one of"), std::string::npos);
  EXPECT_EQ(c.fp8.tensorwise, 0);  // no fp8 rate: --fp8 is refused (Note [Simulated fp8])
  bad = good;
  bad.replace(bad.find("\"table\""), 7, R"("fp8": {"tensorwise": 0}, "table")");
  EXPECT_NE(error_of(bad).find("'gemm.fp8.tensorwise' must be > 0"), std::string::npos)
      << error_of(bad);
  bad = good;
  bad.replace(bad.find("\"table\""), 7, R"("fp8": {"rowwise_outer_vector": 1}, "table")");
  EXPECT_NE(error_of(bad).find("'gemm.fp8.rowwise_outer_vector' must be true or false"),
            std::string::npos) << error_of(bad);
  bad = good;
  bad.replace(bad.find("\"table\""), 7,
              R"("fp8": {"rowwise": 0.7, "rowwise_outer_vector": false}, "table")");
  const Calibration f = parse_calibration(bad, "c.json");
  EXPECT_EQ(f.fp8.rowwise, 0.7);
  EXPECT_FALSE(f.fp8.rowwise_outer_vector);
  EXPECT_THROW(read_calibration("/nonexistent/calibration.json"), UserError);
  EXPECT_THROW(read_calibration("/"), UserError);
}

}  // namespace
}  // namespace fsdp::sim
