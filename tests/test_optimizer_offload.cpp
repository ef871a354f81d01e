// Note [Optimizer offload]: the fp32 masters, grads and optimizer state on the host, each
// group's step there after its grad comes down, its new master up before its next all-gather.
// The host runs the CPU backend's optimizer kernel element for element, so losses, grad norms
// and params are the same bits as the device step, under chaos delays (a missing wait would
// read a grad or a shard at the wrong time); the device's peak is lower by the optimizer
// state; the host's capacity and the combinations that cannot work are one line each.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "command_util.h"
#include "fsdp/error.h"
#include "fsdp/optim_offload.h"
#include "test_checkpoint_util.h"
#include "test_util.h"
#include "backend/sim/sim_backend.h"
#include "runtime/launch_sim.h"
#include "runtime/memory_estimate.h"

namespace fsdp::testing {
namespace {

struct Case {
  std::string name;
  std::string kind = "mlp";
  int world = 2;
  DType param_dtype = DType::F32;
  int micro_batches = 1;
  float clip = 0.05f;  // small: every step clips, so the global norm matters
  std::string optimizer = "adamw";
  int hsdp_replicas = 0;
  int dim = 16;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

runtime::TrainConfig config_of(const Case& k) {
  runtime::TrainConfig c = tiny_config_of_kind(k.kind, k.dim);
  c.steps = 4;
  c.micro_batches = k.micro_batches;
  c.param_dtype = k.param_dtype;
  c.reduce_dtype = k.param_dtype;
  c.hsdp_replicas = k.hsdp_replicas;
  c.optimizer.kind = k.optimizer;
  c.optimizer.max_grad_norm = k.clip;
  c.collect_params = true;
  c.offload.threads = 3;  // chunks of one group's step on several threads
  return c;
}

cpu::CpuOptions chaos(uint64_t seed) { return chaos_options(seed); }

void expect_same_bits(const std::vector<runtime::RankResult>& a,
                      const std::vector<runtime::RankResult>& b, size_t steps) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t rank = 0; rank < a.size(); ++rank) {
    ASSERT_EQ(a[rank].losses.size(), steps) << "rank " << rank;
    EXPECT_EQ(a[rank].losses, b[rank].losses) << "rank " << rank;
    EXPECT_EQ(a[rank].grad_norms, b[rank].grad_norms) << "rank " << rank;
    EXPECT_EQ(a[rank].params, b[rank].params) << "rank " << rank;
  }
}

class OptimizerOffload : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerOffload, SameBitsAsTheDeviceStep) {
  const Case k = GetParam();
  const runtime::TrainConfig device_step = config_of(k);
  runtime::TrainConfig offload = device_step;
  offload.offload_optimizer = true;
  const auto a = run_fsdp(k.world, device_step, chaos(31));
  const auto b = run_fsdp(k.world, offload, chaos(32));
  expect_same_bits(a, b, 4);
  EXPECT_EQ(a[0].offload_host_bytes, 0);
  EXPECT_GT(b[0].offload_host_bytes, 0);
}

// Worlds of 1, 2 and 4; fp32 and bf16 params; micro-batches; clipping (and none); SGD; the
// experts' own mesh (its grad sums on another communicator); HSDP; groups large enough to be
// stepped in chunks on several threads.
INSTANTIATE_TEST_SUITE_P(
    Layouts, OptimizerOffload,
    ::testing::Values(Case{"mlp_one_rank_fp32", "mlp", 1},
                      Case{"mlp_one_rank_bf16_no_clipping", "mlp", 1, DType::BF16, 1, 0.0f},
                      Case{"mlp_two_ranks_bf16_three_micro_batches", "mlp", 2, DType::BF16, 3},
                      Case{"transformer_four_ranks_bf16", "transformer", 4, DType::BF16},
                      Case{"transformer_four_ranks_fp32_two_micro_batches", "transformer", 4,
                           DType::F32, 2},
                      Case{"moe_expert_mesh", "moe", 2},
                      Case{"mlp_sgd", "mlp", 2, DType::F32, 1, 0.05f, "sgd"},
                      Case{"hsdp_2x2", "mlp", 4, DType::F32, 1, 0.05f, "adamw", 2},
                      // Blocks of 512 x 512: each group's step is split across the threads.
                      Case{"mlp_wide_threaded", "mlp", 1, DType::BF16, 1, 0.05f, "adamw", 0, 512}),
    [](const auto& info) { return info.param.name; });

// Experts on the efsdp mesh with expert parallelism (all-to-alls between the groups'
// all-gathers), clipping across both meshes, micro-batches.
TEST(OptimizerOffloadMoe, MoeTransformerWithExpertParallelismIsBitwiseTheDeviceStep) {
  runtime::TrainConfig device_step = tiny_moe_transformer_config(/*ep=*/2, /*experts=*/4, /*steps=*/3);
  device_step.optimizer.max_grad_norm = 0.05f;
  device_step.micro_batches = 2;
  runtime::TrainConfig offload = device_step;
  offload.offload_optimizer = true;
  expect_same_bits(run_fsdp(4, device_step, chaos(61)), run_fsdp(4, offload, chaos(62)), 3);
}

// The float8 all-gather reads the fp32 shard twice, for its amax and its copy-in (Note
// [Float8 all-gather]): both wait for the group's upload, on one rank (the amax at the copy-in)
// and on two (the amaxes in the precompute, before their all-reduce).
TEST(OptimizerOffloadFp8, TheFloat8AllGatherIsBitwiseTheDeviceStep) {
  for (int world : {1, 2}) {
    runtime::TrainConfig device_step = tiny_transformer_config(/*steps=*/4);
    device_step.param_dtype = DType::BF16;
    device_step.fp8 = Fp8Recipe::Tensorwise;
    device_step.optimizer.max_grad_norm = 0.05f;
    runtime::TrainConfig offload = device_step;
    offload.offload_optimizer = true;
    const auto a = run_fsdp(world, device_step, chaos(71));
    for (uint64_t seed : {72, 73, 74}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", seed " + std::to_string(seed));
      expect_same_bits(a, run_fsdp(world, offload, chaos(seed)), 4);
    }
  }
}

// The all-gather's wait for its group's upload is what keeps the copy-in from reading a shard
// the upload is still writing (or has not written): without it, under chaos delays, some
// step trains on another step's params.
TEST(OptimizerOffloadOrdering, WithoutTheAllGathersWaitForTheUploadTheBitsDiffer) {
  const Case k{"mlp", "mlp", 2};
  const runtime::TrainConfig device_step = config_of(k);
  runtime::TrainConfig offload = device_step;
  offload.offload_optimizer = true;
  offload.steps = device_step.steps;
  const auto a = run_fsdp(k.world, device_step, chaos(41));
  runtime::TrainConfig dropped = offload;
  dropped.offload.drop_upload_wait_for_testing = true;
  int differing = 0;
  for (uint64_t seed : {42, 43, 44}) {
    const auto b = run_fsdp(k.world, dropped, chaos(seed));
    differing += b[0].losses != a[0].losses || b[0].params != a[0].params;
  }
  EXPECT_GT(differing, 0) << "no seed saw the race: the test would not catch a missing wait";
  // The same seeds with the wait: the bits of the device step.
  for (uint64_t seed : {42, 43, 44}) expect_same_bits(a, run_fsdp(k.world, offload, chaos(seed)), 4);
}

// The optimizer's state is the difference in the device's peak (the CPU allocator's ledger):
// exactly its bytes in the sharded state, about them in the peak.
TEST(OptimizerOffloadMemory, TheDevicePeakIsLowerByTheOptimizerState) {
  runtime::TrainConfig c = config_of(Case{"mlp", "mlp", 2});
  c.model.dim = 64;  // the state outweighs the activations
  c.model.layers = 4;
  runtime::TrainConfig offload = c;
  offload.offload_optimizer = true;
  const auto a = run_fsdp(2, c), b = run_fsdp(2, offload);
  const int sharded = static_cast<int>(MemTag::ShardedState);
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t state = a[rank].memory.tag_bytes[sharded] - b[rank].memory.tag_bytes[sharded];
    // AdamW: two fp32 states per shard element, besides the fp32 param and grad.
    EXPECT_EQ(state * 2, a[rank].memory.tag_bytes[sharded]) << "rank " << rank;
    const int64_t saved = a[rank].memory.peak_bytes - b[rank].memory.peak_bytes;
    EXPECT_GE(saved, state * 9 / 10) << "rank " << rank;
    EXPECT_LE(saved, state * 11 / 10) << "rank " << rank;
    // Host: a master and two states per element, two grad slots of the largest group, the sums.
    EXPECT_GE(b[rank].offload_host_bytes, state * 3 / 2);
    EXPECT_LE(b[rank].offload_host_bytes, state * 2 + 64);
    EXPECT_EQ(a[rank].params, b[rank].params);
  }
  // The estimate made before any rank starts moves the same bytes from the device to the host.
  const runtime::MemoryEstimate on_device = runtime::estimate_rank_memory(c, 2);
  const runtime::MemoryEstimate offloaded = runtime::estimate_rank_memory(offload, 2);
  const int64_t state = a[0].memory.tag_bytes[sharded] - b[0].memory.tag_bytes[sharded];
  EXPECT_EQ(on_device.device_bytes - offloaded.device_bytes, state);
  // The host: a master and the states per element, two grad slots (the offload's own count).
  const double host = static_cast<double>(offloaded.host_bytes - on_device.host_bytes);
  EXPECT_NEAR(host, static_cast<double>(b[0].offload_host_bytes), 0.05 * host);
}

// Host steps are on their own track: every host step is an optimizer op on the "host
// optimizer" stream, none is on compute; the grads go down and the masters up on theirs. (A
// warm-up step's transfers may still run once the trace starts, so the counts are bounds.)
TEST(OptimizerOffloadTrace, HostStepsHaveTheirOwnTrack) {
  runtime::TrainConfig c = config_of(Case{"mlp", "mlp", 2});
  c.offload_optimizer = true;
  c.timeline = true;
  c.warmup = 1;
  const auto r = run_fsdp(2, c);
  std::map<std::string, std::map<std::string, int>> streams_of;  // label -> stream -> ops
  int optimizer_ops_on_compute = 0;
  for (const TimelineOp& op : r[0].timeline.ops) {
    if (op.stream < 0 || op.kind == OpKind::Wait) continue;
    const std::string& stream = r[0].timeline.stream_names.at(op.stream);
    ++streams_of[op.label][stream];
    optimizer_ops_on_compute += op.kind == OpKind::Optimizer && stream == "compute";
  }
  const int traced = c.steps - c.warmup, groups = c.model.layers + 1;
  const std::vector<std::pair<std::string, std::string>> tracks = {
      {"host optimizer", "host optimizer"},
      {"offload grad D2H", "offload D2H"},
      {"offload param H2D", "offload H2D"}};
  for (const auto& [label, stream] : tracks) {
    ASSERT_EQ(streams_of[label].size(), 1u) << label << " is on more than its own stream";
    EXPECT_GE(streams_of[label][stream], traced * groups) << label;
    EXPECT_LE(streams_of[label][stream], c.steps * groups) << label;
  }
  EXPECT_EQ(optimizer_ops_on_compute, 0);
}

// Saves hold the same shards, so a checkpoint moves between the two placements: an offloaded
// run resumes bitwise, from its own save and from a device-optimizer run's.
TEST(OptimizerOffloadCheckpoint, ResumesBitwiseFromItsOwnSaveAndFromTheDeviceOptimizers) {
  runtime::TrainConfig c = small_config("transformer");
  c.optimizer.max_grad_norm = 0.05f;
  const int world = 2;
  runtime::TrainConfig offload = c;
  offload.offload_optimizer = true;
  const std::string own = fresh_dir("offload_own"), device = fresh_dir("offload_from_device");
  runtime::TrainConfig saving = offload;
  saving.checkpoint.save_dir = own;
  saving.checkpoint.save_every = 4;
  const auto full = run_fsdp(world, saving);
  runtime::TrainConfig device_saving = c;
  device_saving.checkpoint.save_dir = device;
  device_saving.checkpoint.save_every = 4;
  const auto device_full = run_fsdp(world, device_saving);
  EXPECT_EQ(full[0].params, device_full[0].params);
  for (const std::string& dir : {own, device}) {
    runtime::TrainConfig resumed = offload;
    resumed.checkpoint.resume = dir + "/step-000004";
    const auto rest = run_fsdp(world, resumed, chaos(51));
    ASSERT_EQ(rest[0].losses.size(), 2u) << dir;
    EXPECT_EQ(rest[0].losses[0], full[0].losses[4]) << dir;
    EXPECT_EQ(rest[0].losses[1], full[0].losses[5]) << dir;
    EXPECT_EQ(rest[0].params, full[0].params) << dir;
  }
}

// On the simulation backend (which computes nothing) the host steps cost their bytes at the
// host's memory bandwidth and the transfers theirs at the host link's; the memory is the same
// ledger as the CPU ranks', so the device's peak is exactly theirs.
TEST(OptimizerOffloadSim, HostStepsAndTransfersAreTimedAndTheLedgerIsTheCpuRanks) {
  runtime::TrainConfig c = config_of(Case{"mlp", "mlp", 2});
  c.offload_optimizer = true;
  c.timeline = true;
  c.warmup = 1;
  c.collect_params = false;
  const auto cpu_ranks = run_fsdp(2, c);
  sim::SimOptions o;
  o.gpus = 2;
  o.gpus_per_node = 8;
  o.calibration = sim::ideal_calibration(1000, 100, 100);
  o.calibration.host_copy_gbps = 1e-3;  // a megabyte per second: every transfer is visible
  sim::SimWorld world(o);
  const runtime::RankResult r = runtime::run_simulated_training(world, c);
  EXPECT_EQ(r.memory.peak_bytes, cpu_ranks.back().memory.peak_bytes);
  double host_us = 0, up_us = 0;
  for (const TimelineOp& op : r.timeline.ops) {
    if (op.stream < 0) continue;
    const std::string& stream = r.timeline.stream_names.at(op.stream);
    if (stream == "host optimizer" && op.kind == OpKind::Optimizer) host_us += op.end_us - op.start_us;
    if (stream == "offload H2D" && op.kind == OpKind::Copy) up_us += op.end_us - op.start_us;
  }
  EXPECT_GT(host_us, 0);
  // Every group's fp32 shard goes up once per traced step, at (at most) a byte per microsecond.
  const int64_t shard_bytes = cpu_ranks.back().memory.tag_bytes[static_cast<int>(MemTag::ShardedState)] / 2;
  EXPECT_GE(up_us, static_cast<double>((c.steps - c.warmup) * shard_bytes));
}

std::string one_line_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

// The host's memory is checked before any of it is taken: the numbers, in one line.
TEST(OptimizerOffloadCapacity, ARunWhoseHostStateDoesNotFitIsRefusedWithTheNumbers) {
  runtime::TrainConfig c = config_of(Case{"mlp", "mlp", 2});
  c.offload_optimizer = true;
  c.offload.host_memory_limit = 4096;
  const std::string what = one_line_error([&] { run_fsdp(2, c); });
  EXPECT_NE(what.find("the optimizer offload needs"), std::string::npos) << what;
  EXPECT_NE(what.find("x 2 ranks"), std::string::npos) << what;  // both ranks share the host
  EXPECT_NE(what.find("(4096 bytes) is the host memory limit"), std::string::npos) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;

  std::vector<optim::ParamSpan> spans{{nullptr, nullptr, 1000}};
  optim::OffloadOptions o;
  // A master and two states an element, two grad slots of the largest group, one sum.
  o.host_memory_limit = 1000 * 12 + 2 * 1000 * 4 + 4;  // fits exactly
  EXPECT_NO_THROW(optim::check_offload_host_memory(spans, {}, o));
  o.host_memory_limit -= 1;
  EXPECT_NE(one_line_error([&] { optim::check_offload_host_memory(spans, {}, o); })
                .find("20004 bytes"),
            std::string::npos);

  const CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 2 --steps 1 --offload optimizer --host-memory-limit-mib 1 "
      "--dim 512 --layers 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, -1) << "crashed";
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("is the host memory limit"), std::string::npos) << r.output;
}

// What cannot combine with it: each refused in one line naming both flags.
TEST(OptimizerOffloadCombinations, EachBadCombinationIsOneLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--clip-grad-norm 0 --optimizer-in-backward 1", "--optimizer-in-backward"},
      {"--optimizer-in-forward 1", "--optimizer-in-forward"},
  };
  for (const auto& [flags, named] : cases) {
    const CommandResult r =
        run_fsdp_command("train --backend cpu --steps 2 --offload optimizer " + flags);
    EXPECT_NE(r.code, 0) << flags;
    EXPECT_NE(r.code, -1) << "crashed: " << flags;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_NE(r.output.find("--offload"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(named), std::string::npos) << r.output;
  }
  const CommandResult limit = run_fsdp_command("train --backend cpu --steps 1 --host-memory-limit-mib 8");
  EXPECT_NE(limit.code, 0);
  EXPECT_EQ(std::count(limit.output.begin(), limit.output.end(), '\n'), 1) << limit.output;
  EXPECT_NE(limit.output.find("applies to --offload optimizer only"), std::string::npos)
      << limit.output;
  // A captured step (the CPU backend refuses --cuda-graph before this): the library's rule.
  runtime::TrainConfig graph = config_of(Case{"mlp", "mlp", 2});
  graph.offload_optimizer = true;
  graph.cuda_graph = true;
  const auto [option, what] = option_error_of([&] { runtime::check_train_config(graph, 2); });
  EXPECT_EQ(option, "offload") << what;
  EXPECT_NE(what.find("cuda_graph"), std::string::npos) << what;
  // Without clipping the optimizer-in-backward default (-1) steps aside for the offload.
  const CommandResult ok =
      run_fsdp_command("train --backend cpu --steps 2 --clip-grad-norm 0 --offload optimizer");
  EXPECT_EQ(ok.code, 0) << ok.output;
}

}  // namespace
}  // namespace fsdp::testing
