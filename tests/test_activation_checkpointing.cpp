// Activation checkpointing (Note [Activation checkpointing]) per FSDP unit, for the
// transformer and the MoE transformer on CPU ranks: losses, grad norms and params bitwise
// those without checkpointing; the collectives of each phase exactly those without it (the
// recompute reads the params backward gathered); the saved activations of a block exactly
// what each mode keeps; the memory estimate within its 10%; and bad options in one line.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "captured_run.h"
#include "command_util.h"
#include "fsdp/error.h"
#include "models/model_family.h"
#include "runtime/memory_estimate.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

using nn::ActivationCheckpointConfig;

ActivationCheckpointConfig policy(const std::string& text) {
  return nn::parse_activation_checkpoint(text);
}

runtime::TrainConfig with_policy(runtime::TrainConfig c, const std::string& text) {
  c.activation_checkpoint = policy(text);
  return c;
}

// Bitwise: every step's loss and grad norm, and every param after the last step.
void expect_same_training(const runtime::RankResult& got, const runtime::RankResult& want,
                          const std::string& what) {
  ASSERT_FALSE(want.losses.empty()) << what;
  EXPECT_EQ(got.losses, want.losses) << what;
  EXPECT_EQ(got.grad_norms, want.grad_norms) << what;
  EXPECT_EQ(got.params, want.params) << what;
}

// Every communicator's collectives of each kind, forward and backward of the first step.
void expect_same_collectives(const runtime::RankResult& got, const runtime::RankResult& want,
                             const std::string& what) {
  EXPECT_EQ(got.forward_by_comm_first_step, want.forward_by_comm_first_step) << what;
  EXPECT_EQ(got.backward_by_comm_first_step, want.backward_by_comm_first_step) << what;
  EXPECT_GT(want.all_gathers_backward_first_step + want.all_gathers_forward_first_step, 0) << what;
}

runtime::TrainConfig transformer(int layers) {
  runtime::TrainConfig c = tiny_transformer_config(/*steps=*/3);
  c.model.layers = layers;
  c.optimizer.max_grad_norm = 1.0f;
  return c;
}

// ---- parity and collectives

// The schedule's events (every unshard, reshard, post-backward and reduce-scatter, in order)
// are those without checkpointing: the recompute gathers nothing, and each unit reshards at
// its post-backward, after its recompute and its backward.
TEST(ActivationCheckpointing, TransformerTrainsBitwiseWithTheSameCollectivesInEveryMode) {
  for (const bool reshard : {true, false}) {
    runtime::TrainConfig c = transformer(3);
    c.reshard_after_forward = reshard;
    std::vector<ScheduleEvent> none_events, events;
    c.event_log = &none_events;
    const auto none = run_fsdp(2, c);
    ASSERT_FALSE(none_events.empty());
    c.event_log = &events;
    for (const char* mode : {"full", "every:2", "selective"}) {
      const std::string what = std::string(mode) + (reshard ? ", reshard" : ", no reshard");
      events.clear();
      const auto got = run_fsdp(2, with_policy(c, mode));
      EXPECT_EQ(events, none_events) << what;
      for (int r = 0; r < 2; ++r) expect_same_training(got[r], none[r], what);
      expect_same_collectives(got[0], none[0], what);
      // The RS ring's bound: as many RS inputs alive at most as without checkpointing.
      EXPECT_EQ(tag_peak_live(got[0], MemTag::RsInput), tag_peak_live(none[0], MemTag::RsInput))
          << what;
    }
  }
}

TEST(ActivationCheckpointing, Bf16ParamsMicroBatchesAndAPostForwardMeshStayBitwise) {
  runtime::TrainConfig c = transformer(2);
  c.param_dtype = DType::BF16;
  c.reduce_dtype = DType::BF16;
  c.micro_batches = 2;
  c.reshard_after_forward_size = 2;  // the backward all-gather over groups of 2 of 4 ranks
  const auto none = run_fsdp(4, c);
  for (const char* mode : {"full", "selective"}) {
    const auto got = run_fsdp(4, with_policy(c, mode));
    expect_same_training(got[0], none[0], mode);
    expect_same_collectives(got[0], none[0], mode);
  }
}

TEST(ActivationCheckpointing, OptimizerInForwardStaysBitwise) {
  runtime::TrainConfig c = transformer(2);
  c.optimizer_in_forward = true;
  const auto none = run_fsdp(2, c);
  for (const char* mode : {"full", "selective"}) {
    const auto got = run_fsdp(2, with_policy(c, mode));
    expect_same_training(got[0], none[0], mode);
    expect_same_collectives(got[0], none[0], mode);
  }
}

runtime::TrainConfig moe_transformer(int ep, double capacity_factor) {
  runtime::TrainConfig c = tiny_moe_transformer_config(ep, /*experts=*/4, /*steps=*/3);
  c.model.capacity_factor = capacity_factor;
  return c;
}

// Selective keeps the dispatched rows, so nothing is exchanged again; full runs the MoE
// layer's forward again, its ep exchanges (and the dropless counts) included: the backward
// then issues, on the ep communicator, the forward's collectives once more.
TEST(ActivationCheckpointing, MoeTransformerTrainsBitwiseAndOnlyFullRepeatsTheEpExchange) {
  for (const double cf : {0.0, 1.5}) {
    const runtime::TrainConfig c = moe_transformer(/*ep=*/2, cf);
    const auto none = run_fsdp(4, c);
    const std::string tag = cf > 0 ? "capacity" : "dropless";
    const auto selective = run_fsdp(4, with_policy(c, "selective"));
    for (int r = 0; r < 4; ++r) expect_same_training(selective[r], none[r], "selective, " + tag);
    expect_same_collectives(selective[0], none[0], "selective, " + tag);

    const auto full = run_fsdp(4, with_policy(c, "full"));
    for (int r = 0; r < 4; ++r) expect_same_training(full[r], none[r], "full, " + tag);
    EXPECT_EQ(full[0].forward_by_comm_first_step, none[0].forward_by_comm_first_step) << tag;
    for (const auto& [comm, counts] : none[0].backward_by_comm_first_step) {
      std::vector<int64_t> want = counts;
      if (comm == "ep") {
        const std::vector<int64_t>& fwd = none[0].forward_by_comm_first_step.at(comm);
        for (size_t k = 0; k < want.size(); ++k) want[k] += fwd[k];
        EXPECT_GT(fwd[static_cast<int>(CollectiveKind::AllToAll)], 0) << tag;
      }
      EXPECT_EQ(full[0].backward_by_comm_first_step.at(comm), want) << comm << ", " << tag;
    }
  }
}

// Captured steps (Note [Captured steps]) under the CUDA-graph emulator: the recompute is more
// of the same device work inside the step, so the replays train bitwise as eager steps.
TEST(ActivationCheckpointing, CapturedStepsReplayBitwiseAsEagerSteps) {
  runtime::TrainConfig c = moe_transformer(/*ep=*/1, /*capacity_factor=*/1.5);
  c.steps = 5;
  c.warmup = 2;
  for (const char* mode : {"full", "selective"}) {
    const runtime::TrainConfig checkpointed = with_policy(c, mode);
    const auto eager = run_fsdp(2, checkpointed);
    const CapturedRun graph = run_captured(2, checkpointed);
    EXPECT_EQ(graph.ranks[0].captured_step, c.warmup) << mode;
    EXPECT_EQ(graph.replays[0], c.steps - c.warmup) << mode;
    expect_same_training(graph.ranks[0], eager[0], mode);
  }
}

// ---- memory

int64_t activation_peak(const runtime::TrainConfig& c) {
  return run_fsdp(2, c)[0].memory.tag_peak_bytes[static_cast<int>(MemTag::Activation)];
}

// Two more blocks add exactly two blocks' saved activations to the peak, which comes in the
// last block's backward: full keeps a block's input alone (tokens x dim), selective what
// docs/memory.md lists.
TEST(ActivationCheckpointing, EachBlockKeepsExactlyWhatItsModeSays) {
  const runtime::TrainConfig two = transformer(2), four = transformer(4);
  const nn::TransformerConfig t = nn::transformer_config(two.model);
  const int64_t a = 4;  // fp32 activations
  const int64_t tokens = two.tokens, d = t.dim, f = t.ffn_dim;
  const int64_t qkv = (t.heads + 2 * t.kv_heads) * t.head_dim(), q = t.heads * t.head_dim();
  // Per token: the norms' inputs (the block's input, the residual sum) and their rstd, wqkv's
  // output, the attention output and its statistics, w13's output; none adds the norms'
  // outputs and SwiGLU's.
  const int64_t selective = (2 * d + qkv + q + 2 * f) * a + t.heads * 4 + 2 * 4;
  const int64_t none = selective + (2 * d + f) * a;
  const int64_t full = d * a;
  struct Case {
    const char* mode;
    int64_t per_token;
  };
  for (const Case& m : {Case{"none", none}, Case{"selective", selective}, Case{"full", full}}) {
    const int64_t grown =
        activation_peak(with_policy(four, m.mode)) - activation_peak(with_policy(two, m.mode));
    EXPECT_EQ(grown, 2 * tokens * m.per_token) << m.mode;
  }
}

TEST(ActivationCheckpointing, PeakFallsAndTheEstimateFollowsEveryMode) {
  runtime::TrainConfig llama = transformer(4);
  llama.model.dim = 64;
  llama.model.ffn_dim = 512;
  llama.model.vocab = 128;
  llama.model.seq_len = 32;
  llama.tokens = 128;
  llama.collect_params = false;
  llama.steps = 2;
  // Two blocks, a dense one and an MoE one (at four, the estimate's two largest gathered
  // units are both MoE blocks, where the one computing and the one prefetched beside it are
  // one of each: an error of its own, about 9% here, that is not the checkpointing's).
  runtime::TrainConfig moe = tiny_moe_transformer_config(/*ep=*/1, /*experts=*/8, 2);
  moe.model.dim = 64;
  moe.model.heads = 4;
  moe.model.ffn_dim = 128;
  moe.model.expert_ffn_dim = 256;
  moe.model.vocab = 128;
  moe.model.seq_len = 32;
  moe.tokens = 128;
  moe.collect_params = false;
  // Each mode keeps less than the one before it; with two blocks every:2 checkpoints block 0
  // alone, which at the peak (the last block's backward) is all that full spares too.
  for (const runtime::TrainConfig& base : {llama, moe}) {
    int64_t previous = 0, none = 0;
    for (const char* mode : {"none", "selective", "every:2", "full"}) {
      const runtime::TrainConfig c = with_policy(base, mode);
      const int64_t peak = run_fsdp(2, c)[0].memory.peak_bytes;
      const double estimate = static_cast<double>(runtime::estimate_rank_memory(c, 2).device_bytes);
      const std::string what = base.model.kind + ", " + mode;
      std::printf("%s: measured peak %lld bytes, estimate %.0f\n", what.c_str(),
                  static_cast<long long>(peak), estimate);
      EXPECT_NEAR(estimate / static_cast<double>(peak), 1.0, 0.10) << what;
      if (std::string(mode) == "selective") {
        EXPECT_LT(peak, none) << what;
      }
      if (previous > 0) {
        EXPECT_LE(peak, previous) << what;
      } else {
        none = peak;
      }
      previous = peak;
    }
    EXPECT_LT(previous, none) << base.model.kind;
  }
}

// ---- options

TEST(ActivationCheckpointingOptions, ParsesEveryModeAndRefusesTheRestInOneLine) {
  EXPECT_EQ(policy("none").mode, ActivationCheckpoint::None);
  EXPECT_EQ(policy("full").mode, ActivationCheckpoint::Full);
  EXPECT_EQ(policy("selective").mode, ActivationCheckpoint::Selective);
  const ActivationCheckpointConfig every3 = policy("every:3");
  EXPECT_EQ(every3.mode, ActivationCheckpoint::Full);
  EXPECT_EQ(every3.every, 3);
  EXPECT_EQ(every3.to_string(), "every:3");
  EXPECT_EQ(policy("every:1"), policy("full"));
  // Blocks 0 and 3 of 6: the first of every N, so the last block, whose backward comes first,
  // is checkpointed only when L - 1 is a multiple of N.
  std::vector<int> checkpointed;
  for (int i = 0; i < 6; ++i)
    if (every3.of_block(i) == ActivationCheckpoint::Full) checkpointed.push_back(i);
  EXPECT_EQ(checkpointed, (std::vector<int>{0, 3}));
  for (const char* bad : {"every:0", "every:x", "every:", "every:-2", "every: 2",
                          "every:99999999999", "Full", "op", ""}) {
    const auto [option, what] = option_error_of([&] { policy(bad); });
    EXPECT_EQ(option, "activation_checkpoint") << bad << ": " << what;
    EXPECT_EQ(what, std::string("activation_checkpoint must be none, full, every:N (N >= 1: every "
                                "N-th block) or selective, got '") +
                        bad + "'");
  }
  // A config made as a struct meets the same rule where train_rank checks it.
  runtime::TrainConfig c = transformer(2);
  c.activation_checkpoint.mode = ActivationCheckpoint::Full;
  c.activation_checkpoint.every = 0;
  const auto [option, what] = option_error_of([&] { runtime::check_train_config(c, 2); });
  EXPECT_EQ(option, "activation_checkpoint") << what;
}

// Full re-runs any block's forward; selective needs a family that says what is cheap.
TEST(ActivationCheckpointingOptions, FullRunsOnEveryFamilySelectiveOnlyWhereItHasAPolicy) {
  runtime::TrainConfig mlp;
  mlp.model = tiny_mlp_config(3, 8);
  mlp.model.classes = 4;
  mlp.tokens = 4;
  mlp.steps = 2;
  mlp.collect_params = true;
  const auto none = run_fsdp(2, mlp);
  const auto full = run_fsdp(2, with_policy(mlp, "full"));
  expect_same_training(full[0], none[0], "mlp, full");
  const auto [option, what] =
      option_error_of([&] { runtime::check_train_config(with_policy(mlp, "selective"), 2); });
  EXPECT_EQ(option, "activation_checkpoint") << what;
  EXPECT_NE(what.find("selective: the mlp model's blocks have no selective policy"),
            std::string::npos)
      << what;
}

TEST(ActivationCheckpointingOptions, TheCommandNamesItsFlagAndRecordsTheModeInTheSummary) {
  const std::string base =
      "train --backend cpu --world-size 2 --model transformer --layers 2 --dim 16 --heads 2 "
      "--ffn-dim 24 --seq-len 4 --vocab 23 --tokens 8 --steps 2 --quiet";
  const CommandResult bad = run_fsdp_command(base + " --activation-checkpointing every:0");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("--activation-checkpointing must be none, full, every:N (N >= 1: "
                            "every N-th block) or selective, got 'every:0'"),
            std::string::npos)
      << bad.output;
  EXPECT_EQ(bad.output.find(".cpp:"), std::string::npos) << bad.output;
  const CommandResult mlp = run_fsdp_command(
      "train --backend cpu --world-size 2 --model mlp --layers 2 --dim 8 --tokens 4 --steps 1 "
      "--quiet --activation-checkpointing selective");
  EXPECT_NE(mlp.code, 0);
  EXPECT_NE(mlp.output.find("--activation-checkpointing selective: the mlp model's blocks"),
            std::string::npos)
      << mlp.output;
  const std::string json = ::testing::TempDir() + "activation_checkpointing_summary.json";
  const CommandResult ok =
      run_fsdp_command(base + " --activation-checkpointing every:2 --json " + json);
  ASSERT_EQ(ok.code, 0) << ok.output;
  std::ifstream in(json);
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["activation_checkpointing"], "every:2");
}

// A full recompute must not run FSDP's hooks again: a unit inside a checkpointed block is
// refused at the block's forward, before any of its work, in one line.
TEST(ActivationCheckpointingOptions, AnFsdpUnitInsideACheckpointedBlockIsRefusedInOneLine) {
  std::string what = "no error";
  runtime::run_cpu_ranks(1, {}, [&](int, Device& device, std::shared_ptr<Comm> world) {
    auto model = models::build_model(transformer(2).model);
    nn::apply_activation_checkpointing(*model, policy("full"));
    Mesh mesh("dp", device, world);
    fully_shard(*model->blocks()[0]->children()[1], mesh);  // layers.0.attention
    for (Module* b : model->blocks()) fully_shard(*b, mesh);
    fully_shard(*model, mesh);
    const Stream s = device.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&device, s, DType::F32};
    const std::vector<int32_t> ids(16, 1);
    Tensor x = empty_tensor(device, s, DType::I32, 16, 1, MemTag::Activation);
    device.copy_from_host(s, x.data, ids.data(), ids.size() * sizeof(int32_t));
    try {
      model->forward(ctx, x);
    } catch (const UserError& e) {
      what = e.what();
    }
    device.synchronize();
  });
  EXPECT_EQ(what,
            "module 'layers.0' is checkpointed (full) but 'layers.0.attention' inside it "
            "is an FSDP unit of its own, whose hooks its recompute would run again: "
            "checkpoint the inner unit instead");
}

}  // namespace
}  // namespace fsdp::testing
