// Gradient accumulation (TrainConfig::micro_batches, `fsdp train --micro-batches`): N
// micro-batches of B/N rows train exactly as one batch of B rows, up to fp32 rounding.
#include <gtest/gtest.h>

#include "command_util.h"
#include "runtime/batch_source.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

// Serves micro-batch `index % n` of step `index / n` as the matching slice of the rows that
// the inner source gives one whole step: rank r's micro-batch m is rows
// r * rows * n + m * rows, ... of the step's global batch.
class SplitSource : public runtime::BatchSource {
 public:
  SplitSource(std::unique_ptr<runtime::BatchSource> inner, int n) : inner_(std::move(inner)), n_(n) {}
  runtime::DeviceBatch make(Device& d, Stream s, int64_t index, int64_t first_row, int64_t rows,
                            DType act_dtype) override {
    const int64_t rank = first_row / rows;
    return inner_->make(d, s, index / n_, rank * rows * n_ + (index % n_) * rows, rows, act_dtype);
  }

 private:
  std::unique_ptr<runtime::BatchSource> inner_;
  int n_;
};

runtime::TrainConfig base_config(const std::string& kind) {
  runtime::TrainConfig c;
  c.model.kind = kind;
  c.model.layers = 2;
  c.model.dim = 16;
  c.model.classes = kind == "transformer" ? 0 : 5;
  c.model.heads = 2;
  c.model.ffn_dim = 32;
  c.model.seq_len = 4;
  c.model.vocab = 37;
  c.tokens = 16;  // per rank per step
  c.steps = 3;
  c.optimizer.max_grad_norm = 1.0f;  // clipping sees the accumulated gradient
  c.collect_params = true;
  return c;
}

void expect_same_training(const std::string& kind, int world, int n) {
  const runtime::TrainConfig whole = base_config(kind);
  runtime::TrainConfig split = whole;
  split.tokens = whole.tokens / n;
  split.micro_batches = n;
  const nn::ModelConfig model = whole.model;
  const uint64_t seed = whole.seed;
  split.batch_source = [model, seed, n](int, int) {
    std::unique_ptr<runtime::BatchSource> inner =
        model.kind == "transformer" ? runtime::make_synthetic_tokens(model, seed)
                                    : runtime::make_synthetic_features(model, seed);
    return std::make_unique<SplitSource>(std::move(inner), n);
  };
  const auto a = run_fsdp(world, whole);
  const auto b = run_fsdp(world, split);
  ASSERT_EQ(a[0].losses.size(), b[0].losses.size());
  for (size_t s = 0; s < a[0].losses.size(); ++s) {
    EXPECT_NEAR(b[0].losses[s], a[0].losses[s], 1e-5 * std::abs(a[0].losses[s])) << "step " << s;
    EXPECT_NEAR(b[0].grad_norms[s], a[0].grad_norms[s], 1e-5 * std::abs(a[0].grad_norms[s]))
        << "step " << s;
  }
  EXPECT_LE(relative_error(b[0].params, a[0].params), 1e-5) << kind << " world " << world;
}

TEST(MicroBatches, FourMicroBatchesTrainAsOneBatchMlp) { expect_same_training("mlp", 2, 4); }

TEST(MicroBatches, TwoMicroBatchesTrainAsOneBatchTransformer) {
  expect_same_training("transformer", 2, 2);
}

TEST(MicroBatches, CommandSplitsTokensAndReportsTheStep) {
  CommandResult r = run_fsdp_command(
      "train --backend cpu --world-size 2 --model mlp --layers 2 --dim 16 --tokens 32 "
      "--micro-batches 4 --steps 2 --quiet --json /dev/stdout");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("\"micro_batches\": 4"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"tokens_per_rank\": 32"), std::string::npos) << r.output;
}

TEST(MicroBatches, TokensThatDoNotSplitAreRefusedInOneLine) {
  CommandResult r =
      run_fsdp_command("train --backend cpu --tokens 30 --micro-batches 4 --steps 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--tokens (30) must be divisible by --micro-batches (4)"),
            std::string::npos) << r.output;
}

TEST(MicroBatches, TransformerMicroBatchesMustHoldWholeSequences) {
  CommandResult r = run_fsdp_command(
      "train --backend cpu --model transformer --seq-len 64 --tokens 128 --micro-batches 4 "
      "--steps 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--tokens / --micro-batches (32) must be a multiple of --seq-len (64)"),
            std::string::npos) << r.output;
}

}  // namespace
}  // namespace fsdp::testing
