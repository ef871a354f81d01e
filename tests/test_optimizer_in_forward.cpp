// Note [Optimizer in forward]: each group's optimizer step runs in the next forward, on the
// all-gather stream, just before the group's all-gather, and writes the all-gather's input in
// place of the copy-in. The math is the plain step's, element for element, so losses, grad
// norms and params must be the same bits as the step after backward, under chaos delays (a
// missing wait would read a grad or a shard at the wrong time), for every layout the schedule
// has: a second mesh, HSDP, micro-batches, the post-forward mesh, next-step prefetch, SGD.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "fsdp/error.h"
#include "fsdp/fsdp.h"
#include "fsdp/optim.h"
#include "test_util.h"
#include "models/model_family.h"

namespace fsdp::testing {
namespace {

struct Case {
  std::string name;
  std::string kind;
  int world = 2;
  int hsdp_replicas = 0;
  int micro_batches = 1;
  int post_forward = 0;  // reshard_after_forward to groups of this many ranks
  bool prefetch = false;
  std::string optimizer = "adamw";
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

runtime::TrainConfig config_of(const Case& k) {
  runtime::TrainConfig c = tiny_config_of_kind(k.kind);
  c.steps = 5;
  c.micro_batches = k.micro_batches;
  c.hsdp_replicas = k.hsdp_replicas;
  c.reshard_after_forward_size = k.post_forward;
  c.prefetch_next_step = k.prefetch;
  c.optimizer.kind = k.optimizer;
  c.optimizer.max_grad_norm = 0.05f;  // small: every step clips, so the norm matters
  c.collect_params = true;
  return c;
}

cpu::CpuOptions chaos(uint64_t seed) { return chaos_options(seed); }

class OptimizerInForward : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerInForward, SameBitsAsTheStepAfterBackward) {
  const Case k = GetParam();
  const runtime::TrainConfig plain = config_of(k);
  runtime::TrainConfig in_forward = plain;
  in_forward.optimizer_in_forward = true;
  const auto a = run_fsdp(k.world, plain, chaos(11));
  const auto b = run_fsdp(k.world, in_forward, chaos(12));
  for (int rank = 0; rank < k.world; ++rank) {
    ASSERT_EQ(a[rank].losses.size(), 5u);
    EXPECT_EQ(a[rank].losses, b[rank].losses) << "rank " << rank;
    EXPECT_EQ(a[rank].grad_norms, b[rank].grad_norms) << "rank " << rank;
    EXPECT_EQ(a[rank].params, b[rank].params) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, OptimizerInForward,
    ::testing::Values(Case{"mlp_one_rank", "mlp", 1}, Case{"mlp", "mlp", 2},
                      Case{"mlp_sgd", "mlp", 2, 0, 1, 0, false, "sgd"},
                      Case{"mlp_three_micro_batches_prefetch", "mlp", 2, 0, 3, 0, true},
                      Case{"moe_expert_mesh", "moe", 2},
                      Case{"transformer_post_forward_mesh", "transformer", 4, 0, 1, 2},
                      Case{"hsdp_2x2", "mlp", 4, 2}),
    [](const auto& info) { return info.param.name; });

// Experts on the efsdp mesh with expert parallelism (the all-to-alls between the groups'
// all-gathers), and clipping across both meshes.
TEST(OptimizerInForward, MoeTransformerWithExpertParallelismIsBitwiseTheStepAfterBackward) {
  runtime::TrainConfig plain = tiny_moe_transformer_config(/*ep=*/2, /*experts=*/4, /*steps=*/4);
  plain.optimizer.max_grad_norm = 0.05f;
  plain.micro_batches = 2;
  runtime::TrainConfig in_forward = plain;
  in_forward.optimizer_in_forward = true;
  const auto a = run_fsdp(4, plain, chaos(21)), b = run_fsdp(4, in_forward, chaos(22));
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_EQ(a[rank].losses.size(), 4u);
    EXPECT_EQ(a[rank].losses, b[rank].losses) << "rank " << rank;
    EXPECT_EQ(a[rank].grad_norms, b[rank].grad_norms) << "rank " << rank;
    EXPECT_EQ(a[rank].params, b[rank].params) << "rank " << rank;
  }
}

// Where the updates run: in every traced step, one optimizer op per group, each on the
// all-gather stream; and each replaces its group's forward copy-in, so the step has exactly one
// copy-in fewer per group than the plain schedule, whose single optimizer op is on compute.
TEST(OptimizerInForwardSchedule, EachGroupStepsOnTheAllGatherStreamInPlaceOfItsCopyIn) {
  runtime::TrainConfig plain = config_of(Case{"mlp", "mlp", 2});
  plain.timeline = true;
  plain.warmup = 1;  // steps 2..5 traced: each runs the updates of the step before it
  runtime::TrainConfig in_forward = plain;
  in_forward.optimizer_in_forward = true;
  const auto a = run_fsdp(2, plain), b = run_fsdp(2, in_forward);
  const int traced_steps = plain.steps - plain.warmup;
  const int groups = plain.model.layers + 1;  // every block and the root
  auto count = [](const runtime::RankResult& r) {
    std::map<std::string, int> n;  // "optimizer@stream" and "copy-in"
    for (const TimelineOp& op : r.timeline.ops) {
      if (op.kind == OpKind::Optimizer) ++n["optimizer@" + r.timeline.stream_names.at(op.stream)];
      if (op.label.rfind("AG copy-in", 0) == 0) ++n["copy-in"];
    }
    return n;
  };
  const auto plain_ops = count(a[0]), forward_ops = count(b[0]);
  EXPECT_EQ(plain_ops.at("optimizer@compute"), traced_steps);
  EXPECT_EQ(forward_ops.count("optimizer@compute"), 0u);
  EXPECT_EQ(forward_ops.at("optimizer@all-gather"), traced_steps * groups);
  EXPECT_EQ(forward_ops.at("copy-in"), plain_ops.at("copy-in") - traced_steps * groups);
  EXPECT_EQ(a[0].params, b[0].params);
}

// The API by hand: an update stays pending until the group's next all-gather runs it (or an
// explicit apply), exactly once; misuse is a one-line UserError.
TEST(OptimizerInForwardApi, AnUpdateRunsOnceAtTheNextAllGatherAndMisuseIsOneLine) {
  auto expect_user_error = [](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected: " << words;
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  };
  runtime::run_cpu_ranks(1, {}, [&](int, Device& device, std::shared_ptr<Comm> world) {
    const Stream s = device.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&device, s, DType::F32};
    Mesh mesh("dp", device, world);
    std::unique_ptr<nn::Model> model_built = models::build_model(tiny_mlp_config(2, 8));
  nn::Model& model = *model_built;
    FsdpModule& root = fully_shard(model, mesh);
    std::vector<optim::ParamSpan> spans;
    for (const ShardedGroupView& g : sharded_groups(root))
      spans.push_back({g.param, g.grad, g.numel, &g.mesh->comm(), g.name});
    optim::Optimizer optimizer(device, s, spans, {});
    optimizer.zero_grad(s);
    optim::OptimizerInForward updates(optimizer, s);  // counts the updates it runs
    root.set_optimizer_in_forward(updates);
    expect_user_error([&] { root.set_optimizer_in_backward({}); }, "not both");
    Tensor x = empty_tensor(device, s, DType::F32, 4, 8, MemTag::Activation);
    device.fill(s, x.data, DType::F32, x.numel(), 0.5f);
    model.forward(ctx, x);  // lazy init; the root keeps its params gathered
    root.reshard();
    root.defer_shard_updates(s);
    EXPECT_EQ(root.pending_shard_updates(), 1);
    EXPECT_TRUE(updates.pending(0));
    EXPECT_EQ(updates.parts_run(), 0);
    expect_user_error([&] { root.defer_shard_updates(s); }, "have not all run");
    model.forward(ctx, x);  // the all-gather runs the update, once
    EXPECT_EQ(updates.parts_run(), 1);  // group 0's, the one pending
    EXPECT_FALSE(updates.pending(0));
    EXPECT_EQ(root.pending_shard_updates(), 0);
    root.reshard();
    root.defer_shard_updates(s);
    root.apply_pending_shard_updates(s);
    root.apply_pending_shard_updates(s);  // nothing left: no second run
    EXPECT_EQ(updates.parts_run(), 2);
    device.synchronize();
  });
}

TEST(OptimizerInForwardSchedule, TheOptimizerInBackwardTooIsRefusedInOneLine) {
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --steps 1 --clip-grad-norm 0 --optimizer-in-backward 1 "
      "--optimizer-in-forward 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, -1) << "crashed";
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("exclude each other"), std::string::npos) << r.output;
}

// The command resolves the optimizer's placement once (Note [Command defaults]): with clipping
// off, the optimizer goes in backward by default, but not when it is asked for in forward.
TEST(OptimizerInForwardSchedule, WithClippingOffTheDefaultLeavesTheOptimizerInForward) {
  const std::string json = ::testing::TempDir() + "optimizer_in_forward_default.json";
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 2 --model mlp --layers 2 --dim 8 --tokens 4 --steps 2 "
      "--clip-grad-norm 0 --optimizer-in-forward 1 --quiet --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(json);
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["optimizer_in_forward"], true);
  EXPECT_EQ(s["optimizer_in_backward"], false);
}

}  // namespace
}  // namespace fsdp::testing
