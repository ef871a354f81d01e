// The trainer's captured steps (Note [Captured steps]) on CPU ranks, through the CUDA-graph
// emulator of graph_emulator.h: the step recorded once and replayed must train bitwise as the
// eager steps do (the same ops, in the same order, on the same streams), with the lr schedule
// read from device memory at every replay; and what cannot be captured fails in one line.
#include <gtest/gtest.h>

#include "captured_run.h"
#include "runtime/batch_source.h"

namespace fsdp::testing {
namespace {

runtime::TrainConfig small(const std::string& kind) {
  runtime::TrainConfig c;
  c.model.kind = kind;
  c.model.layers = 3;
  c.model.dim = 16;
  c.model.hidden = 24;
  c.model.experts = 3;
  c.model.classes = kind == "transformer" ? 0 : 5;
  c.model.heads = 2;
  c.model.ffn_dim = 32;
  c.model.seq_len = 4;
  c.model.vocab = 37;
  c.tokens = 8;
  c.steps = 8;
  c.warmup = 2;
  c.optimizer.max_grad_norm = 1.0f;
  c.schedule.kind = "cosine";  // a different lr at every replayed step
  c.schedule.warmup_steps = 2;
  c.schedule.min_lr = 1e-4f;
  c.collect_params = true;
  return c;
}

void expect_captured_equals_eager(const runtime::TrainConfig& c, int world) {
  const auto eager = run_fsdp(world, c);
  const CapturedRun graph = run_captured(world, c);
  const runtime::RankResult& r = graph.ranks[0];
  EXPECT_EQ(r.captured_step, c.warmup);
  EXPECT_EQ(graph.replays[0], c.steps - c.warmup);
  EXPECT_EQ(r.graph_streams,
            (std::vector<std::string>{"compute", "all-gather", "reduce-scatter"}));
  ASSERT_EQ(r.losses.size(), eager[0].losses.size());
  EXPECT_EQ(r.losses, eager[0].losses);
  EXPECT_EQ(r.grad_norms, eager[0].grad_norms);
  EXPECT_EQ(r.lrs, eager[0].lrs);
  EXPECT_EQ(r.params, eager[0].params);
}

TEST(CapturedStepEmulated, MlpReplaysBitwiseAsEager) { expect_captured_equals_eager(small("mlp"), 2); }

TEST(CapturedStepEmulated, FourMicroBatchesTwoRsBuffersSeparateGroup) {
  runtime::TrainConfig c = small("mlp");
  c.micro_batches = 4;
  c.tokens = 4;
  c.rs_max_input_buffers = 2;
  c.separate_rs_group = true;
  expect_captured_equals_eager(c, 2);
}

TEST(CapturedStepEmulated, TransformerWithTheOptimizerInBackward) {
  runtime::TrainConfig c = small("transformer");
  c.optimizer.max_grad_norm = 0;
  c.optimizer_in_backward = true;
  c.micro_batches = 2;
  expect_captured_equals_eager(c, 2);
}

TEST(CapturedStepEmulated, MoeWithExpertsOnTheirOwnMesh) {
  runtime::TrainConfig c = small("moe");
  c.reshard_after_forward = false;
  expect_captured_equals_eager(c, 2);
}

// Note [Optimizer in forward]: each group's update, replayed inside the next step's forward on
// the all-gather stream, gives the step after backward's bits. Evaluation between steps runs
// the pending updates early, eagerly; the step after it then runs eagerly, so that no update
// runs twice (the replay would run it again) or never.
TEST(CapturedStepEmulated, OptimizerInForwardReplaysBitwiseAsTheStepAfterBackward) {
  runtime::TrainConfig c = small("transformer");
  c.micro_batches = 2;
  runtime::TrainConfig in_forward = c;
  in_forward.optimizer_in_forward = true;
  const auto plain = run_fsdp(2, c);
  const CapturedRun graph = run_captured(2, in_forward);
  EXPECT_EQ(graph.replays[0], c.steps - c.warmup);
  EXPECT_EQ(graph.ranks[0].losses, plain[0].losses);
  EXPECT_EQ(graph.ranks[0].grad_norms, plain[0].grad_norms);
  EXPECT_EQ(graph.ranks[0].params, plain[0].params);

  for (runtime::TrainConfig* t : {&c, &in_forward}) {
    t->eval_source = [model = c.model](int, int) { return runtime::make_synthetic_tokens(model, 99); };
    t->eval_every = 3;  // after steps 3, 6 and 8 (1-based)
    t->eval_batches = 1;
  }
  const auto plain_eval = run_fsdp(2, c);
  const CapturedRun graph_eval = run_captured(2, in_forward);
  // Steps 3..8 (1-based) would replay; steps 4 and 7 follow an evaluation and run eagerly.
  EXPECT_EQ(graph_eval.replays[0], c.steps - c.warmup - 2);
  EXPECT_EQ(graph_eval.ranks[0].losses, plain_eval[0].losses);
  EXPECT_EQ(graph_eval.ranks[0].val_losses, plain_eval[0].val_losses);
  EXPECT_EQ(graph_eval.ranks[0].params, plain_eval[0].params);
  ASSERT_EQ(plain_eval[0].val_losses.size(), 3u);
}

// HSDP adds the all-reduce stream, and only HSDP does: the graph holds exactly the streams
// the schedule uses.
TEST(CapturedStepEmulated, HsdpAddsTheAllReduceStream) {
  runtime::TrainConfig c = small("mlp");
  c.hsdp_replicas = 2;
  const auto eager = run_fsdp(4, c);
  const CapturedRun graph = run_captured(4, c);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(graph.ranks[r].graph_streams,
              (std::vector<std::string>{"compute", "all-gather", "reduce-scatter", "all-reduce"}));
    EXPECT_EQ(graph.ranks[r].losses, eager[r].losses) << "rank " << r;
    EXPECT_EQ(graph.ranks[r].params, eager[r].params) << "rank " << r;
  }
}

// Note [Graph memory plan]: a graph reuses a freed block only where the free happens before
// the allocation, so each all-gather must be ordered after the reshards issued before it on
// compute; without that the graph holds every layer's unsharded params at once (+50% here).
// With it, the graph needs exactly eager's peak, plus what a captured step keeps by design: its
// 4-byte loss slot and one fixed input buffer per micro-batch (eager mode holds one at a time).
TEST(CapturedStepEmulated, GraphMemoryEqualsEagerPeak) {
  struct Case {
    const char* kind;
    int k, micro_batches;
    bool optimizer_in_backward;
  };
  for (const Case& cs : {Case{"mlp", 1, 1, false}, Case{"mlp", 2, 4, false},
                         Case{"transformer", 1, 1, false}, Case{"transformer", 2, 2, true},
                         Case{"moe", 1, 1, false}, Case{"mlp", 1, 1, true}}) {
    runtime::TrainConfig c = small(cs.kind);
    c.model.layers = 8;
    c.model.dim = 64;
    c.model.hidden = 64;
    c.model.ffn_dim = 128;
    c.steps = 4;
    c.rs_max_input_buffers = cs.k;
    c.micro_batches = cs.micro_batches;
    c.optimizer_in_backward = cs.optimizer_in_backward;
    if (cs.optimizer_in_backward) c.optimizer.max_grad_norm = 0;
    c.param_dtype = DType::BF16;
    for (int world : {1, 2}) {
      const auto eager = run_fsdp(world, c);
      const CapturedRun graph = run_captured(world, c);
      const int64_t batch_bytes =  // inputs (fp32 rows or int32 ids) and int32 labels
          c.tokens * (c.model.kind == "transformer" ? 4 : c.model.dim * 4) + c.tokens * 4;
      const int64_t kept =
          static_cast<int64_t>(sizeof(float)) + (cs.micro_batches - 1) * batch_bytes;
      for (int r = 0; r < world; ++r)
        EXPECT_LE(graph.graph_peak_bytes[r], eager[r].peak_bytes_by_step.back() + kept)
            << cs.kind << " k=" << cs.k << " micro-batches " << cs.micro_batches << " world "
            << world << " rank " << r;
    }
  }
}

TEST(CapturedStepEmulated, AHostWaitInsideTheStepIsRefused) {
  runtime::TrainConfig c = small("mlp");
  c.after_backward = [](runtime::TrainState& s) { s.device.synchronize(); };
  try {
    run_captured(1, c);
    FAIL() << "a host wait was captured";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("host waits for the device inside the step"),
              std::string::npos) << e.what();
  }
}

TEST(CapturedStepEmulated, StateKeptAcrossStepsIsRefused) {
  runtime::TrainConfig c = small("mlp");
  void* kept = nullptr;  // a buffer made in each step and freed in the next
  c.after_backward = [&kept](runtime::TrainState& s) {
    if (kept) s.device.free(kept, s.compute);
    kept = s.device.alloc(16, s.compute, MemTag::Other);
  };
  try {
    run_captured(1, c);
    FAIL() << "memory crossing the step boundary was captured";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("frees memory allocated before it"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fsdp::testing
