// FSDP2's collective-count formulas per communicator, with and without HSDP, for
// reshard_after_forward true / false / int (Note [Post-forward mesh]); the post-forward
// shard's memory; one-line errors for bad HSDP input.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "fsdp/error.h"
#include "fsdp/nn/model.h"
#include "test_util.h"
#include "models/model_family.h"

namespace fsdp::testing {
namespace {

constexpr int kAg = static_cast<int>(CollectiveKind::AllGather);
constexpr int kRs = static_cast<int>(CollectiveKind::ReduceScatter);
constexpr int kAr = static_cast<int>(CollectiveKind::AllReduce);

runtime::TrainConfig blocks(int layers) {
  runtime::TrainConfig c;
  c.model.kind = "mlp";  // the root holds no params: every unit is a block
  c.model.layers = layers;
  c.model.dim = 16;
  c.tokens = 4;
  c.steps = 1;
  return c;
}

int64_t count(const std::map<std::string, std::vector<int64_t>>& m, const std::string& comm,
              int kind) {
  auto it = m.find(comm);
  return it == m.end() ? 0 : it->second[kind];
}

struct Expected {
  int64_t ag_forward, ag_backward_shard, ag_backward_small, rs, ar;
};

// shard: the shard group's communicator; small: the post-forward one (if any).
void expect_counts(const runtime::RankResult& r, const std::string& shard,
                   const std::string& small, const std::string& replicate, const Expected& e,
                   const std::string& what) {
  const auto& f = r.forward_by_comm_first_step;
  const auto& b = r.backward_by_comm_first_step;
  EXPECT_EQ(count(f, shard, kAg), e.ag_forward) << what;
  EXPECT_EQ(count(f, small, kAg), 0) << what;
  EXPECT_EQ(count(b, shard, kAg), e.ag_backward_shard) << what;
  EXPECT_EQ(count(b, small, kAg), e.ag_backward_small) << what;
  EXPECT_EQ(count(b, shard, kRs), e.rs) << what;
  EXPECT_EQ(count(b, replicate, kAr), e.ar) << what;
  // Nothing else anywhere (the loss's all-reduce comes after these counts).
  int64_t total = 0;
  for (const auto* m : {&f, &b})
    for (const auto& [name, v] : *m)
      for (int64_t n : v) total += n;
  EXPECT_EQ(total, e.ag_forward + e.ag_backward_shard + e.ag_backward_small + e.rs + e.ar) << what;
}

// L units: forward gathers each once on the shard group; backward gathers the resharded
// ones again (on the post-forward group for an int), reduce-scatters each on the shard
// group and, with HSDP, all-reduces each on the replicate group.
TEST(HsdpCounts, Fsdp2FormulasPerCommunicator) {
  const int L = 4;
  struct Case {
    int replicas;  // 0: plain FSDP
    int world;
    std::optional<bool> reshard;
    int size;  // reshard_after_forward=<int>; 0: the bool
  };
  for (const Case k : {Case{0, 4, true, 0}, Case{0, 4, false, 0}, Case{0, 4, true, 2},
                       Case{2, 4, true, 0}, Case{2, 4, false, 0}, Case{2, 8, true, 2},
                       Case{4, 8, true, 0}, Case{0, 8, true, 4}, Case{2, 8, true, 4}}) {
    runtime::TrainConfig c = blocks(L);
    c.reshard_after_forward = *k.reshard;
    c.reshard_after_forward_size = k.size;
    c.hsdp_replicas = k.replicas;
    const std::string shard = k.replicas ? "dp/shard" : "world";
    const int shard_size = k.world / std::max(k.replicas, 1);
    const bool small_group = k.size > 0 && k.size < shard_size;
    const std::string small = shard + "/post_forward" + std::to_string(k.size);
    const std::string what = "replicas " + std::to_string(k.replicas) + " world " +
                             std::to_string(k.world) + " reshard " +
                             (k.size ? std::to_string(k.size) : *k.reshard ? "true" : "false");
    const auto r = run_fsdp(k.world, c);
    for (const auto& rank : r)
      expect_counts(rank, shard, small, "dp/replicate",
                    {L, *k.reshard && !small_group ? L : 0, small_group ? L : 0, L,
                     k.replicas > 1 ? L : 0},
                    what);
  }
}

TEST(HsdpCounts, NoSyncMicroBatchIssuesNeitherReduceScatterNorAllReduce) {
  runtime::TrainConfig c = blocks(3);
  c.micro_batches = 2;  // the counts are of micro-batch 0, gradient sync off
  c.hsdp_replicas = 2;
  const auto r = run_fsdp(4, c);
  EXPECT_EQ(count(r[0].backward_by_comm_first_step, "dp/shard", kRs), 0);
  EXPECT_EQ(count(r[0].backward_by_comm_first_step, "dp/replicate", kAr), 0);
}

// reshard_after_forward=<int> gives the same training as true, with and without HSDP.
TEST(PostForwardMesh, ParityWithTheReferenceForEveryGroupSize) {
  runtime::TrainConfig c = blocks(3);
  c.model.dim = 17;  // padding
  c.model.classes = 5;
  c.model.kind = "resmlp";
  c.steps = 3;
  c.collect_params = true;
  const auto ref = run_reference(c, 8);
  struct Case {
    int replicas, size;
  };
  for (const Case k : {Case{0, 2}, Case{0, 4}, Case{2, 2}, Case{0, 8}}) {
    c.hsdp_replicas = k.replicas;
    c.reshard_after_forward_size = k.size;
    const auto r = run_fsdp(8, c);
    EXPECT_LE(relative_error(r[0].params, ref.params), 1e-6)
        << "replicas " << k.replicas << " size " << k.size;
  }
  runtime::TrainConfig t = tiny_transformer_config(/*steps=*/2);
  const auto tref = run_reference(t, 8);
  t.hsdp_replicas = 2;
  t.reshard_after_forward_size = 2;
  EXPECT_LE(relative_error(run_fsdp(8, t)[0].params, tref.params), 1e-6) << "transformer";
}

// Between forward and backward a unit keeps 1/N of its all-gather output (W / N rank slots),
// on its own tag: for L units of one D x D weight each, L x (W / N) x ceil(D / W) x D x p.
TEST(PostForwardMesh, KeepsOneNthOfEachUnitBetweenForwardAndBackward) {
  for (int size : {2, 4}) {
    runtime::TrainConfig c = blocks(4);
    c.reshard_after_forward_size = size;
    const auto r = run_fsdp(8, c);
    const int64_t per_unit = int64_t{8 / size} * (16 / 8) * 16 * 4;
    EXPECT_EQ(r[0].memory.tag_peak_bytes[static_cast<int>(MemTag::PostForward)], 4 * per_unit)
        << size;
    EXPECT_EQ(r[0].memory.tag_bytes[static_cast<int>(MemTag::PostForward)], 0) << "freed";
  }
}

// A forward with no backward (evaluation) leaves post-forward shards; if the fp32 shards
// change before the next forward (an optimizer step), that forward must not gather the stale
// chunks.
void expect_no_stale_params_after_a_forward(int world_size, int replicas) {
  runtime::run_cpu_ranks(world_size, {}, [&](int, Device& d, std::shared_ptr<Comm> world) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&d, s, DType::F32};
    Mesh mesh = replicas ? make_hsdp_mesh("dp", d, *world, replicas, world_size / replicas)
                         : Mesh("dp", d, world);
    std::unique_ptr<nn::Model> model_built = models::build_model(tiny_mlp_config(2, 8));
  nn::Model& model = *model_built;
    FullyShardOptions o;
    o.reshard_after_forward = 2;
    for (Module* b : model.blocks()) fully_shard(*b, mesh, o);
    FsdpModule& root = fully_shard(model, mesh);
    Tensor x = empty_tensor(d, s, DType::F32, 3, 8, MemTag::Activation);
    d.fill(s, x.data, DType::F32, x.numel(), 1.0f);
    std::vector<float> out(24);
    Tensor y = model.forward(ctx, x);
    d.copy_to_host(s, out.data(), y.data, out.size() * sizeof(float));
    d.synchronize_stream(s);
    double first = 0;
    for (float v : out) first += std::abs(v);
    ASSERT_GT(first, 0);
    for (const ShardedGroupView& g : sharded_groups(root, false))
      d.fill(s, g.param, DType::F32, g.numel, 0.0f);  // what an optimizer step could do
    y = model.forward(ctx, x);
    d.copy_to_host(s, out.data(), y.data, out.size() * sizeof(float));
    d.synchronize_stream(s);
    for (float v : out) EXPECT_EQ(v, 0.0f);
  });
}

TEST(PostForwardMesh, AForwardWithoutBackwardServesNoStaleParams) {
  expect_no_stale_params_after_a_forward(4, 0);
}
TEST(PostForwardMesh, AnHsdpForwardWithoutBackwardServesNoStaleParams) {
  expect_no_stale_params_after_a_forward(8, 2);  // shard 4, post-forward groups of 2
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(HsdpBadInput, OneLineErrors) {
  // replicate x shard must be the world
  std::string e = error_of([] {
    runtime::run_cpu_ranks(4, {}, [](int, Device& d, std::shared_ptr<Comm> world) {
      make_hsdp_mesh("dp", d, *world, 3, 2);
    });
  });
  EXPECT_NE(e.find("replicate x shard (3 x 2) must equal the world size 4"), std::string::npos) << e;
  // reshard_after_forward=<int>: FSDP2's rules, 1 refused
  for (int n : {1, 3, 8, 0, -2}) {
    e = error_of([n] {
      runtime::run_cpu_ranks(4, {}, [n](int, Device& d, std::shared_ptr<Comm> world) {
        Mesh mesh = make_hsdp_mesh("dp", d, *world, 1, 4);
        std::unique_ptr<nn::Model> model_built = models::build_model(tiny_mlp_config(1, 4));
  nn::Model& model = *model_built;
        FullyShardOptions o;
        o.reshard_after_forward = n;
        fully_shard(*model.blocks()[0], mesh, o);
      });
    });
    const std::string want = n == 1 ? "reshard_after_forward=1 for module 'layers.0' would keep "
                                      "every param whole on each rank: pass false instead"
                                    : "reshard_after_forward=" + std::to_string(n) +
                                          " for module 'layers.0' must divide the shard group "
                                          "size 4 of mesh 'dp' (an int from 2 to 4)";
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  // a 1-D placement mesh inside an HSDP module would skip the all-reduce
  e = error_of([] {
    runtime::run_cpu_ranks(4, {}, [](int rank, Device& d, std::shared_ptr<Comm> world) {
      Mesh mesh = make_hsdp_mesh("dp", d, *world, 2, 2);
      Mesh flat("flat", d, world->split(rank / 2, rank, "flat"));  // the shard group's ranks
      std::unique_ptr<nn::Model> model_built = models::build_model(tiny_mlp_config(1, 4));
  nn::Model& model = *model_built;
      FullyShardOptions o;
      o.shard_placement_fn = [&](const Module&, const Param&) { return &flat; };
      fully_shard(*model.blocks()[0], mesh, o);
    });
  });
  EXPECT_NE(e.find("is placed on 1-D mesh 'flat' inside HSDP mesh 'dp': its grads would never "
                   "be averaged across replicas"),
            std::string::npos)
      << e;
  runtime::TrainConfig c = blocks(2);
  c.hsdp_replicas = 3;
  e = error_of([&] { run_fsdp(4, c); });
  // The library names its own option (Note [Options checked once]); the command, its flag.
  EXPECT_NE(e.find("hsdp_replicas 3 must divide the world size 4"), std::string::npos) << e;
}

TEST(HsdpCommand, FlagRunsAndLandsInTheSummary) {
  const std::string json = ::testing::TempDir() + "hsdp_summary.json";
  const auto ok = run_fsdp_command(
      "train --backend cpu --world-size 4 --hsdp 2 --model mlp --layers 2 --dim 16 --tokens 4 "
      "--steps 2 --reshard-after-forward 2 --quiet --json " + json);
  ASSERT_EQ(ok.code, 0) << ok.output;
  std::ifstream in(json);
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["hsdp_replicas"], 2);
  EXPECT_EQ(s["reshard_after_forward"], 2);
  const auto bad = run_fsdp_command(
      "train --backend cpu --world-size 4 --hsdp 3 --model mlp --layers 2 --dim 16 --steps 1");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("--hsdp 3 must divide the world size 4"), std::string::npos) << bad.output;
  const auto bad_size = run_fsdp_command(
      "train --backend cpu --world-size 4 --hsdp 2 --reshard-after-forward 4 --model mlp "
      "--layers 2 --dim 16 --steps 1");
  EXPECT_NE(bad_size.code, 0);
  EXPECT_NE(bad_size.output.find("--reshard-after-forward 4 must divide the shard size 2 "
                                 "(the world size / the replicas)"),
            std::string::npos)
      << bad_size.output;
}

}  // namespace
}  // namespace fsdp::testing
