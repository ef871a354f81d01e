// set_separate_reduce_scatter_group: which communicator each collective ran on, from the
// per-communicator counts of the first step (RankResult::*_by_comm_first_step). With the
// separate group on, every reduce-scatter runs on a communicator of its own, one per distinct
// rank set ("<first mesh's name>/rs"), and none on the ones the all-gathers use; off, there is
// no such communicator and the reduce-scatters run beside the all-gathers. For the dense mesh
// and expert meshes (moe with experts on their own mesh; moe-transformer with --ep).
#include <gtest/gtest.h>

#include <map>

#include "test_util.h"

namespace fsdp::testing {
namespace {

constexpr int kAg = static_cast<int>(CollectiveKind::AllGather);
constexpr int kRs = static_cast<int>(CollectiveKind::ReduceScatter);

// Forward plus backward collectives of `kind` on communicator `name`.
int64_t count(const runtime::RankResult& r, const std::string& name, int kind) {
  int64_t n = 0;
  for (const auto* m : {&r.forward_by_comm_first_step, &r.backward_by_comm_first_step})
    if (auto it = m->find(name); it != m->end()) n += it->second[kind];
  return n;
}

int64_t count_everywhere(const runtime::RankResult& r, int kind) {
  int64_t n = 0;
  for (const auto* m : {&r.forward_by_comm_first_step, &r.backward_by_comm_first_step})
    for (const auto& [name, v] : *m) n += v[kind];
  return n;
}

// `meshes`: the communicator the all-gathers of each of the model's meshes run on, and the
// separate communicator its reduce-scatters must run on: one per distinct rank set
// (CommContext::reduce_scatter_comm), named after the first mesh with those ranks.
void expect_rs_on_own_groups(runtime::TrainConfig c, int world,
                             const std::vector<std::pair<std::string, std::string>>& meshes) {
  c.steps = 1;
  c.separate_rs_group = false;
  const auto off = run_fsdp(world, c);
  c.separate_rs_group = true;
  const auto on = run_fsdp(world, c);
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::map<std::string, int64_t> want_on_rs;  // per RS communicator: its meshes' RS
    int64_t rs_total = 0;
    for (const auto& [mesh, rs] : meshes) {
      SCOPED_TRACE(mesh);
      // Off: beside the all-gathers, and no RS communicator at all.
      const int64_t n = count(off[rank], mesh, kRs);
      EXPECT_GT(n, 0);
      EXPECT_GT(count(off[rank], mesh, kAg), 0);
      EXPECT_EQ(off[rank].backward_by_comm_first_step.count(rs), 0u);
      // On: none beside the all-gathers, which stay where they were.
      EXPECT_EQ(count(on[rank], mesh, kRs), 0);
      EXPECT_EQ(count(on[rank], mesh, kAg), count(off[rank], mesh, kAg));
      want_on_rs[rs] += n;
      rs_total += n;
    }
    // On: every reduce-scatter on its RS communicator, which runs nothing else.
    for (const auto& [rs, n] : want_on_rs) {
      EXPECT_EQ(count(on[rank], rs, kRs), n) << rs;
      EXPECT_EQ(count(on[rank], rs, kAg), 0) << rs;
    }
    // No reduce-scatter anywhere else, either way.
    EXPECT_EQ(count_everywhere(off[rank], kRs), rs_total);
    EXPECT_EQ(count_everywhere(on[rank], kRs), rs_total);
  }
}

TEST(RsCommunicator, DenseMeshReduceScattersRunOnTheirOwnGroupOnlyWhenSeparate) {
  runtime::TrainConfig mlp;
  mlp.model = tiny_mlp_config(3, 16);
  mlp.tokens = 4;
  expect_rs_on_own_groups(mlp, 2, {{"world", "world/rs"}});
  expect_rs_on_own_groups(tiny_transformer_config(1), 2, {{"world", "world/rs"}});
}

TEST(RsCommunicator, ExpertMeshReduceScattersRunOnTheirOwnGroupOnlyWhenSeparate) {
  runtime::TrainConfig moe;
  moe.model.kind = "moe";
  moe.model.layers = 2;
  moe.model.dim = 16;
  moe.model.experts = 2;
  moe.model.classes = 4;
  moe.tokens = 4;
  moe.experts_on_own_mesh = true;
  // The expert mesh has the dense mesh's ranks, so the two share one RS communicator.
  expect_rs_on_own_groups(moe, 2, {{"world", "world/rs"}, {"experts", "world/rs"}});
}

TEST(RsCommunicator, ExpertParallelMeshReduceScattersRunOnTheirOwnGroupOnlyWhenSeparate) {
  // ep 2 of 4 ranks: the experts shard over "efsdp" (2 ranks), the rest over all 4.
  expect_rs_on_own_groups(tiny_moe_transformer_config(2, 4, 1), 4,
                          {{"world", "world/rs"}, {"efsdp", "efsdp/rs"}});
}

}  // namespace
}  // namespace fsdp::testing
