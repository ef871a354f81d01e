// The MoE transformer with expert parallelism on CPU ranks: parity with the unsharded
// reference (every expert on one rank) for several dp = ep x efsdp layouts, the RS ring's
// bound with the dense (dp) and expert (efsdp) groups firing in every order, flat peak memory,
// chaos schedules, and the command.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "test_util.h"
#include "models/model_family.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig moe_config(int ep) {
  return tiny_moe_transformer_config(ep, /*experts=*/4, /*steps=*/3);
}

// Every param's initial value (all experts): what the reference starts from.
std::vector<std::vector<float>> initial_params(const runtime::TrainConfig& c) {
  nn::ModelConfig m = c.model;
  m.ep = 1;
  std::unique_ptr<nn::Model> model_built = models::build_model(m);
  nn::Model& model = *model_built;
  std::vector<std::vector<float>> out;
  for (Param* p : model.all_params()) out.push_back(p->init_values());
  return out;
}

std::vector<std::vector<float>> minus(const std::vector<std::vector<float>>& a,
                                      const std::vector<std::vector<float>>& b) {
  std::vector<std::vector<float>> out = a;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) out[i][j] -= b[i][j];
  return out;
}

// The reference's params as rank `rank` holds them: the experts' params (w13, w2) are the
// rank's block of E / ep experts.
std::vector<std::vector<float>> as_held_by(const std::vector<std::vector<float>>& ref,
                                           const std::vector<std::vector<float>>& held, int rank,
                                           int ep) {
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (held[i].size() == ref[i].size()) {
      out.push_back(ref[i]);
      continue;
    }
    const size_t n = held[i].size();
    EXPECT_EQ(n * static_cast<size_t>(ep), ref[i].size()) << "param " << i;
    const size_t first = static_cast<size_t>(rank % ep) * n;
    out.emplace_back(ref[i].begin() + static_cast<std::ptrdiff_t>(first),
                     ref[i].begin() + static_cast<std::ptrdiff_t>(first + n));
  }
  return out;
}

TEST(MoeTransformerModel, ExpertParamsAndActiveParamsPerEpLayout) {
  runtime::TrainConfig c = moe_config(1);
  const int64_t per_expert = 3 * 16 * 8;  // w13 and w2 of one expert: 3 * dim * expert ffn
  std::unique_ptr<nn::Model> all_built = models::build_model(c.model);
  nn::Model& all = *all_built;
  int64_t expert_params = 0;
  for (Param* p : all.all_params())
    if (p->shape().size() == 3) expert_params += p->numel();
  EXPECT_EQ(expert_params, 4 * per_expert);  // one MoE block (layer 1), 4 experts
  EXPECT_EQ(all.active_param_count(), all.param_count() - 2 * per_expert);  // top-2 of 4
  c.model.ep = 2;
  c.model.ep_rank = 1;
  std::unique_ptr<nn::Model> half_built = models::build_model(c.model);
  nn::Model& half = *half_built;
  EXPECT_EQ(half.param_count(), all.param_count() - 2 * per_expert);  // 2 local experts
  EXPECT_EQ(half.active_param_count(), all.active_param_count());
  // Ep rank 1 holds global experts 2 and 3: the same values as the unsharded model's.
  const auto held = [](nn::Model& m, const std::string& fqn) {
    for (Param* p : m.all_params())
      if (p->shape().size() == 3 && fqn.ends_with(p->name())) return p->init_values();
    return std::vector<float>{};
  };
  const std::vector<float> w2_all = held(all, "w2"), w2_half = held(half, "w2");
  ASSERT_EQ(w2_half.size() * 2, w2_all.size());
  EXPECT_TRUE(std::equal(w2_half.begin(), w2_half.end(), w2_all.begin() + w2_half.size()));
}

// MFU counts active params: 6 (active - vocab dim) + 12 layers dim seq_len, as the dense
// transformer (the reported MFU once used the mlp's formula for this model).
TEST(MoeTransformerModel, FlopsPerTokenCountActiveParams) {
  runtime::TrainConfig c = moe_config(1);
  c.model.layers = 4;  // blocks 1 and 3 are MoE
  std::unique_ptr<nn::Model> model_built = models::build_model(c.model);
  nn::Model& model = *model_built;
  const double expected = 6.0 * static_cast<double>(model.active_param_count() - 23 * 16) +
                          12.0 * 4 * 16 * 4;
  EXPECT_DOUBLE_EQ(models::flops_per_token(c.model), expected);
}

struct Layout {
  int world, ep;
};
void PrintTo(const Layout& l, std::ostream* os) {
  *os << "world " << l.world << " as ep " << l.ep << " x efsdp " << l.world / l.ep;
}

class MoeTransformerParity : public ::testing::TestWithParam<Layout> {};

// SGD, not AdamW: AdamW's update hardly changes when a grad is scaled, so a wrong divide
// factor on the experts' grads (Note [Gradient divide factor]) would pass unnoticed. The
// updates (param - init) are compared, not the params, for the same reason.
TEST_P(MoeTransformerParity, DroplessMatchesTheUnshardedReference) {
  const auto [world, ep] = GetParam();
  runtime::TrainConfig c = moe_config(ep);
  c.optimizer.kind = "sgd";
  c.optimizer.sgd_lr = 0.5f;
  const runtime::RankResult ref = run_reference(c, world);
  const auto init = initial_params(c);
  const auto results = run_fsdp(world, c);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(results[r].params.size(), ref.params.size());
    const auto& held = results[r].params;
    const auto init_held = as_held_by(init, held, r, ep);
    EXPECT_LE(relative_error(minus(held, init_held),
                             minus(as_held_by(ref.params, held, r, ep), init_held)),
              1e-5)
        << "rank " << r;
    for (int s = 0; s < c.steps; ++s)
      EXPECT_NEAR(results[r].losses[s], ref.losses[s], 1e-6 * std::abs(ref.losses[s]));
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front());  // the updates are not noise
}

INSTANTIATE_TEST_SUITE_P(Layouts, MoeTransformerParity,
                         ::testing::Values(Layout{2, 2}, Layout{4, 2}, Layout{8, 2}, Layout{8, 4},
                                           Layout{2, 1}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.world) + "_ep" +
                                  std::to_string(info.param.ep) + "_efsdp" +
                                  std::to_string(info.param.world / info.param.ep);
                         });

TEST(MoeTransformerOptions, CapacityFactorAndSeparateRsGroupKeepParity) {
  runtime::TrainConfig c = moe_config(2);
  c.model.capacity_factor = 1.0;  // drops tokens, static shapes (padded slots)
  const auto ref = run_reference(c, 4);
  c.separate_rs_group = true;
  c.rs_max_input_buffers = 2;
  const auto results = run_fsdp(4, c);
  for (int r = 0; r < 4; ++r)
    EXPECT_LE(relative_error(results[r].params, as_held_by(ref.params, results[r].params, r, 2)), 2e-6);
}

// The other grad paths under a divide factor: no-sync micro-batches (unsharded accumulation,
// then one reduce-scatter) and the optimizer in backward (a transient grad shard).
TEST(MoeTransformerOptions, MicroBatchesAndOptimizerInBackwardKeepParity) {
  runtime::TrainConfig c = moe_config(2);
  c.optimizer.kind = "sgd";
  c.optimizer.sgd_lr = 0.5f;
  const auto init = initial_params(c);
  for (bool in_backward : {false, true}) {
    c.micro_batches = in_backward ? 1 : 2;
    c.optimizer_in_backward = in_backward;
    const auto ref = run_reference(c, 4);
    const auto results = run_fsdp(4, c);
    for (int r = 0; r < 4; ++r) {
      const auto& held = results[r].params;
      const auto init_held = as_held_by(init, held, r, 2);
      EXPECT_LE(relative_error(minus(held, init_held),
                               minus(as_held_by(ref.params, held, r, 2), init_held)),
                1e-5)
          << "optimizer in backward " << in_backward << " rank " << r;
    }
  }
}

// ---- the RS ring: a block's dense group (dp) and expert group (efsdp) share the root's ring
using nn::MoeGradOrder;
const MoeGradOrder kOrders[] = {MoeGradOrder::DenseFirst, MoeGradOrder::ExpertsFirst,
                                MoeGradOrder::Interleaved, MoeGradOrder::ExpertsDeferred};

TEST(MoeTransformerRing, BoundHoldsForEveryFiringOrderAndIsReached) {
  for (MoeGradOrder order : kOrders)
    for (int k : {1, 2, 4})
      for (int every : {1, 2}) {
      runtime::TrainConfig c = moe_config(2);
      c.model.layers = 4;  // 7 or 9 reduce-scatters per step: deeper than any k here
      c.model.moe_every = every;
      c.model.expert_grad_order = order;
      c.rs_max_input_buffers = k;
      c.steps = 1;
      c.collect_params = false;
      for (const auto& rank : run_fsdp(4, c))
        EXPECT_EQ(tag_peak_live(rank, MemTag::RsInput), k)
            << "order " << static_cast<int>(order) << " k " << k << " moe every " << every;
      }
}

TEST(MoeTransformerRing, Fsdp212DrainGrowsWhileTheRingStaysAtK) {
  // 2.12 drains only in a unit's last group (an MoE block's experts); deferred to the root,
  // the experts' grads come after every dense group, so with an MoE layer in every block
  // nothing drains during backward.
  std::vector<int64_t> legacy;
  for (int layers : {2, 4}) {
    runtime::TrainConfig c = moe_config(2);
    c.model.layers = layers;
    c.model.moe_every = 1;
    c.model.expert_grad_order = MoeGradOrder::ExpertsDeferred;
    c.steps = 1;
    c.collect_params = false;
    c.rs_policy = RsReclaimPolicy::Fsdp2_12LastGroupDrains;
    legacy.push_back(tag_peak_live(run_fsdp(4, c)[0], MemTag::RsInput));
    c.rs_policy = RsReclaimPolicy::BoundedRing;
    EXPECT_EQ(tag_peak_live(run_fsdp(4, c)[0], MemTag::RsInput), 1);
  }
  EXPECT_EQ(legacy, (std::vector<int64_t>{2, 4}));  // one per block
}

// ---- peak memory per step: flat. With a capacity factor the shapes are static (every expert
// gets exactly its capacity of rows), so the peak repeats to the byte. 30 steps of a small
// model keep the test fast; dropless routing's activation sizes follow the routing instead.
TEST(MoeTransformerMemory, PeakOfTheLastStepEqualsTheThird) {
  runtime::TrainConfig c = moe_config(2);
  c.model.capacity_factor = 1.5;
  c.steps = 30;
  c.collect_params = false;
  const int world = 4;
  std::vector<std::vector<int64_t>> peaks(world);
  runtime::run_cpu_ranks(world, {}, [&](int rank, Device& device, std::shared_ptr<Comm> comm) {
    runtime::train_rank(device, comm, c, [&](const runtime::StepReport&) {
      peaks[rank].push_back(device.memory_stats().peak_bytes);
      device.reset_peak_memory();
    });
  });
  // Steps are read one step late (Note [Asynchronous step read]): the window before step s's
  // report holds the issue of step s + 1, and the last report comes after the loop, when
  // nothing is issued any more. So the last full window is the one before the last report.
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(peaks[r].size(), 30u);
    EXPECT_EQ(peaks[r][28], peaks[r][2]) << "rank " << r;
    EXPECT_GT(peaks[r][2], 0) << "rank " << r;
  }
}

// ---- chaos: random delays in every stream op and collective phase, the all-to-alls included
// As processes, the expert-parallel meshes are Gloo communicators split off the world, and
// the token all-to-alls go through Gloo's alltoallv.
class MoeTransformerChaos : public ::testing::TestWithParam<RanksAs> {};

TEST_P(MoeTransformerChaos, SchedulesGiveTheSameParams) {
  FSDP_SKIP_WITHOUT_PROCESSES(GetParam());
  const runtime::TrainConfig c = moe_config(2);
  const auto calm = run_fsdp(4, c);
  for (uint64_t seed : {1, 2, 3}) {
    cpu::CpuOptions chaos;
    chaos.chaos = true;
    chaos.chaos_seed = seed;
    chaos.chaos_max_us = 100;
    const auto r = run_fsdp(4, c, chaos, GetParam());
    for (int rank = 0; rank < 4; ++rank)
      EXPECT_EQ(r[rank].params, calm[rank].params) << "seed " << seed << " rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAs, MoeTransformerChaos,
                         ::testing::Values(RanksAs::Threads, RanksAs::Processes),
                         [](const auto& info) { return std::string(ranks_as_name(info.param)); });

// ---- the command
TEST(MoeTransformerCli, TrainsOnFourRanksWithEp2AndTheLossFalls) {
  const std::string json = ::testing::TempDir() + "moe_transformer_summary.json";
  const CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 4 --ep 2 --model moe-transformer --layers 2 --dim 32 "
      "--heads 4 --ffn-dim 40 --experts 4 --top-k 2 --expert-ffn-dim 16 --seq-len 8 --vocab 61 "
      "--tokens 16 --steps 40 --lr 1e-2 --json " + json);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("max_expert_load"), std::string::npos) << r.output;
  std::ifstream in(json);
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["model"], "moe-transformer");
  EXPECT_EQ(s["ep"], 2);
  EXPECT_NEAR(s["loss_first"].get<double>(), std::log(61.0) + 0.01, 0.1);  // + the aux loss
  EXPECT_LT(s["loss_last"].get<double>(), 3.0);
  const double load = s["max_expert_load"].get<double>();
  EXPECT_GE(load, 0.25);  // 4 experts: at least a quarter on the busiest
  EXPECT_LE(load, 1.0);
  // The peak since the first step, after each step (bench/run_moe_bench.sh reads steps 3 and
  // 100): one per step, never falling, ending at the run's peak (flatness with static shapes is
  // MoeTransformerMemory's).
  const auto peaks = s["peak_mem_bytes_by_step"].get<std::vector<int64_t>>();
  ASSERT_EQ(peaks.size(), 40u);
  EXPECT_TRUE(std::is_sorted(peaks.begin(), peaks.end()));
  EXPECT_EQ(peaks.back(), s["peak_mem_bytes"].get<int64_t>());
}

TEST(MoeTransformerCli, BadLayoutsAreOneLineErrors) {
  const std::string base =
      "train --backend cpu --model moe-transformer --layers 2 --dim 16 --heads 2 --seq-len 4 "
      "--tokens 8 --steps 1 ";
  const CommandResult a = run_fsdp_command(base + "--world-size 4 --ep 3 --experts 6");
  EXPECT_NE(a.code, 0);
  EXPECT_NE(a.output.find("--world-size (4) must be divisible by --ep (3)"), std::string::npos)
      << a.output;
  const CommandResult b = run_fsdp_command(base + "--world-size 4 --ep 4 --experts 6");
  EXPECT_NE(b.code, 0);
  EXPECT_NE(b.output.find("--experts (6) must be divisible by --ep (4)"), std::string::npos)
      << b.output;
  const CommandResult c = run_fsdp_command(
      "train --backend cpu --world-size 2 --model transformer --ep 2 --steps 1");
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.output.find("--ep applies to models with experts split over ranks"), std::string::npos)
      << c.output;
}

}  // namespace
}  // namespace fsdp::testing
