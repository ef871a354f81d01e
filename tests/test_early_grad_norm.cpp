// Note [Early grad norm]: each group's grad squares are summed as soon as its grad shard is
// final, on the stream that wrote it (reduce-scatter, or all-reduce under HSDP), instead of all
// at once on compute after backward. The norms, the clipping and so every value must be the
// same bits as the late sum, which an after_backward hook still gets (it may change grads).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "test_util.h"

namespace fsdp::testing {
namespace {

struct Case {
  std::string kind;
  int world;
  int hsdp_replicas;
  int micro_batches;
};

runtime::TrainConfig config_of(const Case& k) {
  runtime::TrainConfig c;
  c.model.kind = k.kind;
  c.model.layers = 3;
  c.model.dim = 16;
  c.model.classes = 4;
  if (k.kind == "moe") {
    c.model.hidden = 10;
    c.model.experts = 3;
  }
  c.tokens = 6;
  c.steps = 4;
  c.micro_batches = k.micro_batches;
  c.hsdp_replicas = k.hsdp_replicas;
  c.optimizer.max_grad_norm = 0.05f;  // small: every step clips, so the norm matters
  c.collect_params = true;
  c.timeline = true;
  return c;
}

// The streams that ran a "grad norm" sum.
std::set<std::string> grad_norm_streams(const runtime::RankResult& r) {
  std::set<std::string> out;
  for (const TimelineOp& op : r.timeline.ops)
    if (op.label == "grad norm" && op.kind == OpKind::Kernel)
      out.insert(r.timeline.stream_names.at(op.stream));
  return out;
}

class EarlyGradNorm : public ::testing::TestWithParam<Case> {};

TEST_P(EarlyGradNorm, SameBitsAsTheSumAfterBackward) {
  const Case k = GetParam();
  runtime::TrainConfig early = config_of(k);
  runtime::TrainConfig late = config_of(k);
  late.after_backward = [](runtime::TrainState&) {};  // turns the early sums off
  const auto a = run_fsdp(k.world, early), b = run_fsdp(k.world, late);
  for (int rank = 0; rank < k.world; ++rank) {
    EXPECT_EQ(a[rank].grad_norms, b[rank].grad_norms) << "rank " << rank;
    EXPECT_EQ(a[rank].losses, b[rank].losses) << "rank " << rank;
    EXPECT_EQ(a[rank].params, b[rank].params) << "rank " << rank;
  }
  EXPECT_EQ(a[0].grad_norms.size(), 4u);
  // Where the sums ran: beside the collectives that finish each grad, or on compute. An
  // expert that got no tokens has no reduce-scatter: finalize zero-fills its grad on compute,
  // and the late sum covers it there.
  const std::string finishes = k.hsdp_replicas > 1 ? "all-reduce" : "reduce-scatter";
  if (k.kind == "moe")
    EXPECT_EQ(grad_norm_streams(a[0]).count(finishes), 1u);
  else
    EXPECT_EQ(grad_norm_streams(a[0]), (std::set<std::string>{finishes}));
  EXPECT_EQ(grad_norm_streams(b[0]), (std::set<std::string>{"compute"}));
}

INSTANTIATE_TEST_SUITE_P(Models, EarlyGradNorm,
                         ::testing::Values(Case{"mlp", 1, 0, 1}, Case{"mlp", 2, 0, 1},
                                           Case{"mlp", 2, 0, 3}, Case{"moe", 2, 0, 1},
                                           Case{"mlp", 4, 2, 1}),
                         [](const auto& info) {
                           const Case& k = info.param;
                           return k.kind + "_world" + std::to_string(k.world) + "_hsdp" +
                                  std::to_string(k.hsdp_replicas) + "_mb" +
                                  std::to_string(k.micro_batches);
                         });

}  // namespace
}  // namespace fsdp::testing
