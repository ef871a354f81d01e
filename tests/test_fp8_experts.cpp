// The grouped experts in fp8 (Note [Fp8 experts]): each expert is an fp8 Linear of its own
// rows, whatever their count (padded to cuBLASLt's multiples of 16 and back), the MoE
// transformer trains sharded as unsharded, bitwise, its experts gather as fp8 on the expert
// mesh, and no bf16 expert GEMM is left.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"
#include "fp8_test_util.h"
#include "grouped_experts_case.h"
#include "fsdp/nn/moe.h"
#include "nn/fp8_linear.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

using cpu::cpu_test::download;
using cpu::cpu_test::Floats;
using cpu::cpu_test::upload;

constexpr DType kBf16 = DType::BF16;

// Four experts of dim 32 and expert FFN 16, with 5, 0, 23 and 16 rows: neither the counts
// nor their offsets are multiples of 16, one expert is empty and one needs no padding.
class GroupedExpertsFp8 : public ::testing::TestWithParam<Fp8Recipe> {
 protected:
  static constexpr int64_t kDim = 32, kFfn = 16;
  const std::vector<int64_t> counts_{5, 0, 23, 16};
  cpu::CpuWorld world_{1, {}};
  std::unique_ptr<Device> dev_ = world_.make_device(0);
  Stream s_ = dev_->create_stream("s", StreamPriority::Normal);
  RunContext ctx_{dev_.get(), s_, kBf16};

  Tensor tensor(const Floats& v, int64_t rows, int64_t cols) {
    return view_tensor(upload(*dev_, s_, v, kBf16), kBf16, rows, cols);
  }
  Floats host(const Tensor& t) { return download(*dev_, s_, t.data, t.numel(), t.dtype); }
  Tensor empty(int64_t rows, int64_t cols) {
    return empty_tensor(*dev_, s_, kBf16, rows, cols, MemTag::Activation);
  }
  Tensor rows_of(const Tensor& t, int64_t first, int64_t rows) {
    return view_tensor(static_cast<char*>(t.data) + first * t.cols * 2, t.dtype, rows, t.cols);
  }
};

// The module's forward, input grad and weight grads are those of each expert's own fp8
// Linears on its unpadded rows, bit for bit; the empty expert's weight grads are zeros.
TEST_P(GroupedExpertsFp8, EachExpertIsAnFp8LinearOfItsUnpaddedRows) {
  const std::unique_ptr<nn::GroupedExperts> made = four_experts(kDim, kFfn, 5);
  nn::GroupedExperts& experts = *made;
  Param& w13 = *experts.params()[0];
  Param& w2 = *experts.params()[1];
  w13.value = tensor(cpu::cpu_test::values(w13.numel(), 0.3f, 1), w13.rows(), w13.cols());
  w2.value = tensor(cpu::cpu_test::values(w2.numel(), 0.3f, 2), w2.rows(), w2.cols());
  w13.fp8 = w2.fp8 = GetParam();
  const int64_t rows = 44;
  const Tensor x = tensor(cpu::cpu_test::values(rows * kDim, 1.0f, 3), rows, kDim);
  const Tensor dy = tensor(cpu::cpu_test::values(rows * kDim, 0.5f, 4), rows, kDim);
  experts.counts = counts_;
  const Floats out = host(experts.forward(ctx_, x));
  const Floats dx = host(experts.backward(ctx_, dy, true));
  const Floats dw13 = host(w13.grad), dw2 = host(w2.grad);

  // The reference: expert by expert, on its own rows, through nn's fp8 Linear functions.
  Tensor ref_out = empty(rows, kDim), ref_dx = empty(rows, kDim);
  Tensor ref_dw13 = empty(w13.numel() / kDim, kDim), ref_dw2 = empty(w2.numel() / kFfn, kFfn);
  dev_->fill(s_, ref_dw13.data, kBf16, ref_dw13.numel(), 0.0f);
  dev_->fill(s_, ref_dw2.data, kBf16, ref_dw2.numel(), 0.0f);
  int64_t off = 0;
  for (int l = 0; l < 4; ++l) {
    const int64_t n = counts_[static_cast<size_t>(l)];
    if (n == 0) continue;
    const nn::Fp8Weight a = nn::fp8_weight_block(w13, l, 2 * kFfn, kDim);
    const nn::Fp8Weight b = nn::fp8_weight_block(w2, l, kDim, kFfn);
    Tensor h = empty(n, 2 * kFfn), act = empty(n, kFfn), o = rows_of(ref_out, off, n);
    const auto xs13 = nn::fp8_linear_forward(ctx_, a, rows_of(x, off, n), h);
    dev_->swiglu_forward(s_, h.data, kBf16, n, kFfn, act.data, nullptr);
    const auto xs2 = nn::fp8_linear_forward(ctx_, b, act, o);
    Tensor dact = empty(n, kFfn), dh = empty(n, 2 * kFfn), dxl = rows_of(ref_dx, off, n);
    Tensor dw2l = rows_of(ref_dw2, l * kDim, kDim), dw13l = rows_of(ref_dw13, l * 2 * kFfn, 2 * kFfn);
    const Tensor dyl = rows_of(dy, off, n);
    const auto dy2 = nn::fp8_linear_input_grad(ctx_, b, dyl, dact);
    nn::fp8_linear_weight_grad(ctx_, b, act, dyl, dw2l, xs2.get(), dy2.get());
    dev_->swiglu_backward(s_, h.data, dact.data, kBf16, n, kFfn, dh.data, nullptr);
    const auto dy13 = nn::fp8_linear_input_grad(ctx_, a, dh, dxl);
    nn::fp8_linear_weight_grad(ctx_, a, rows_of(x, off, n), dh, dw13l, xs13.get(), dy13.get());
    off += n;
  }
  const char* recipe = fp8_recipe_name(GetParam());
  EXPECT_EQ(out, host(ref_out)) << recipe;
  EXPECT_EQ(dx, host(ref_dx)) << recipe;
  EXPECT_EQ(dw13, host(ref_dw13)) << recipe;
  EXPECT_EQ(dw2, host(ref_dw2)) << recipe;
  // Expert 1 got no rows: zeros. The others' grads are not.
  const size_t block13 = 2 * kFfn * kDim;
  for (size_t i = block13; i < 2 * block13; ++i) ASSERT_EQ(dw13[i], 0.0f) << recipe << " " << i;
  EXPECT_NE(dw13[0], 0.0f) << recipe;
}

INSTANTIATE_TEST_SUITE_P(Recipes, GroupedExpertsFp8,
                         ::testing::Values(Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise),
                         [](const auto& info) { return std::string(fp8_recipe_name(info.param)); });

runtime::TrainConfig moe_fp8_config(Fp8Recipe recipe, int steps = 3) {
  runtime::TrainConfig c = tiny_moe_transformer_config(/*ep=*/1, /*experts=*/4, steps);
  c.param_dtype = DType::BF16;
  c.fp8 = recipe;
  return c;
}

// Sharded over 2 ranks (experts too) against 2 replicas of the whole model: the same bits,
// dropless and with a capacity factor (static shapes, routed on the device).
TEST(Fp8Experts, MoeTransformerShardedMatchesUnshardedBitwise) {
  for (Fp8Recipe recipe : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise})
    for (double capacity : {0.0, 1.5}) {
      runtime::TrainConfig c = moe_fp8_config(recipe);
      c.model.capacity_factor = capacity;
      const auto sharded = run_fsdp(2, c);
      c.hsdp_replicas = 2;
      const std::string what = std::string(fp8_recipe_name(recipe)) + " capacity " + std::to_string(capacity);
      expect_bitwise(sharded[0], run_fsdp(2, c)[0], what);
    }
}

// Every expert GEMM runs in fp8 (none of the bf16 grouped GEMMs is left), and the loss stays
// near bf16's: measured here, the largest gap at any of 12 steps is below 0.2% for both
// recipes; the bound is 1%, while a wrong scale or a lost padding row moves it by far more.
TEST(Fp8Experts, NoBf16ExpertGemmIsLeftAndTheLossStaysNearBf16s) {
  runtime::TrainConfig bf16_config = moe_fp8_config(Fp8Recipe::None, 12);
  const auto bf16 = run_fsdp(2, bf16_config);
  for (Fp8Recipe recipe : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise}) {
    runtime::TrainConfig c = moe_fp8_config(recipe, 12);
    c.timeline = true;
    const auto fp8 = run_fsdp(2, c);
    std::map<std::string, int> kernels;
    for (const TimelineOp& op : fp8[0].timeline.ops)
      if (op.kind == OpKind::Kernel) ++kernels[op.label];
    int fp8_gemms = 0;
    for (const auto& [label, n] : kernels) {
      EXPECT_EQ(label.find("expert gemm"), std::string::npos) << label;
      if (label.find("expert fp8 gemm") != std::string::npos) fp8_gemms += n;
    }
    EXPECT_GT(fp8_gemms, 0) << fp8_recipe_name(recipe);
    double worst = 0;
    for (size_t s = 0; s < bf16[0].losses.size(); ++s)
      worst = std::max<double>(worst, std::abs(fp8[0].losses[s] - bf16[0].losses[s]) / bf16[0].losses[s]);
    EXPECT_LT(worst, 0.01) << fp8_recipe_name(recipe);
    EXPECT_NE(fp8[0].losses, bf16[0].losses) << "fp8 must change something";
  }
}

// The experts' group on 2 ranks holds 2 of the 4 experts per rank: w13's 2 x 16 x 16 and
// w2's 2 x 16 x 8 elements, 768, so 1536 bytes a gather in bf16 and 768 as fp8, in forward
// and backward of each step. Their amaxes join the step's one all-reduce (max).
TEST(Fp8Experts, TheExpertsGatherHalfTheBytes) {
  const int steps = 2;
  runtime::TrainConfig c = moe_fp8_config(Fp8Recipe::Tensorwise, steps);
  const auto fp8 = record(2, c);
  c.fp8_all_gather = false;
  const auto bf16 = record(2, c);
  auto gathers_of = [](const std::vector<Collective>& log, int64_t bytes) {
    int n = 0;
    for (const Collective& a : only(log, CollectiveKind::AllGather)) n += a.bytes == bytes;
    return n;
  };
  EXPECT_EQ(gathers_of(bf16[0], 1536), steps * 2);
  EXPECT_EQ(gathers_of(fp8[0], 768), steps * 2);
  EXPECT_EQ(gathers_of(fp8[0], 1536), 0);
  EXPECT_EQ(only(fp8[0], CollectiveKind::AllGather).size(), only(bf16[0], CollectiveKind::AllGather).size());
}

}  // namespace
}  // namespace fsdp::testing
