// fp8 on the simulation backend (Note [Simulated fp8]): every fp8 GEMM of a llama-like step
// costs its bf16 GEMM at the calibration's ratio, the transposes and the rowwise fp32 pass
// their exact bytes, the float8 all-gather moves half the weights' bytes and adds one amax
// all-reduce a step. Values come from the cost log of the virtual clock, so they are exact.
#include <gtest/gtest.h>

#include <string>

#include "backend/sim/sim_backend.h"
#include "fsdp/error.h"
#include "runtime/launch_sim.h"
#include "test_util.h"

namespace fsdp::sim {
namespace {

CostLog simulate(const Calibration& calibration, int gpus, const runtime::TrainConfig& c) {
  SimOptions o;
  o.gpus = gpus;
  o.gpus_per_node = 8;
  o.calibration = calibration;
  o.cost_log = true;
  SimWorld world(o);
  runtime::run_simulated_training(world, c);
  return world.cost_log();
}

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// A small llama: dim 256, 4 heads of 64, 2 KV heads, FFN 512, 256 tokens.
runtime::TrainConfig llama_like(Fp8Recipe fp8) {
  runtime::TrainConfig c;
  c.model.kind = "transformer";
  c.model.layers = 2;
  c.model.dim = 256;
  c.model.heads = 4;
  c.model.kv_heads = 2;
  c.model.ffn_dim = 512;
  c.model.seq_len = 128;
  c.model.vocab = 512;
  c.tokens = 256;
  c.steps = 2;
  c.param_dtype = DType::BF16;
  c.fp8 = fp8;
  return c;
}

struct Linear {
  double in, out;
};
// The fp8 Linears of one llama_like block: wqkv [256 + 2 * 2 * 64, 256], wo, w13, w2.
constexpr Linear kBlock[] = {{256, 512}, {256, 256}, {256, 1024}, {512, 256}};

struct GemmTotals {
  double bf16_us = 0;        // bf16 GEMMs of the fp8 Linears' calls, in the bf16 run
  double fp8_us = 0;         // their fp8 GEMMs in the fp8 run
  double other_bf16_us = 0;  // the fp8 run's remaining bf16 GEMMs (the head)
  double head_us = 0;        // the same calls in the bf16 run
  int calls = 0;
  int weight_grads = 0;  // of them, dW: fp8 in the nt layout where bf16 runs tn
};

// The [in, out] of the Linear a label names (".wqkv ", ".wo ", ".w13 ", ".w2 ").
Linear linear_of(const std::string& label, const Linear (&shapes)[4]) {
  const char* names[4] = {".wqkv ", ".wo ", ".w13 ", ".w2 "};
  for (int i = 0; i < 4; ++i)
    if (label.find(names[i]) != std::string::npos) return shapes[i];
  ADD_FAILURE() << "no Linear in " << label;
  return {0, 0};
}

// Pairs each fp8 GEMM of `fp8` ("<linear> fp8 gemm ...", fp8_gemm_<layout>) with the bf16
// GEMM of the same call in `bf16` ("<linear> gemm ...", gemm_<layout>), checking each call's
// time: `ratio` x its bf16 GEMM's in the layout the fp8 call has. The weight grad's fp8 GEMM
// reads the transposed codes (Note [Fp8 operands reused by the weight grad]), so its layout
// is nt where bf16's is tn: its bf16 time in nt comes from the calibration.
GemmTotals pair_gemms(const Calibration& cal, const CostLog& bf16, const CostLog& fp8,
                      double ratio, const Linear (&shapes)[4], double tokens) {
  GemmTotals t;
  for (const auto& [key, e] : fp8) {
    const auto& [label, op] = key;
    if (starts_with(op, "gemm_")) {
      t.other_bf16_us += e.us;
      const auto it = bf16.find(key);
      EXPECT_TRUE(it != bf16.end()) << label;
      if (it != bf16.end()) t.head_us += it->second.us;
      continue;
    }
    if (!starts_with(op, "fp8_gemm_")) continue;
    std::string plain = label;
    const size_t at = plain.find(" fp8 gemm");
    EXPECT_NE(at, std::string::npos) << label;
    if (at == std::string::npos) continue;
    plain.erase(at, 4);  // " fp8"
    const bool weight_grad = label.find(" dW") != std::string::npos;
    const std::string bf16_op = weight_grad ? "gemm_tn" : op.substr(4);
    const auto it = bf16.find({plain, bf16_op});
    EXPECT_TRUE(it != bf16.end()) << "no bf16 GEMM for " << label << " " << op;
    if (it == bf16.end()) continue;
    EXPECT_EQ(e.ops, it->second.ops) << label;
    EXPECT_EQ(e.flops, it->second.flops) << label;
    if (weight_grad) {
      EXPECT_EQ(op, "fp8_gemm_nt") << label;
      const Linear l = linear_of(label, shapes);
      const double nt = gemm_us(cal, DType::BF16, static_cast<int64_t>(l.out),
                                static_cast<int64_t>(l.in), static_cast<int64_t>(tokens), 1);
      EXPECT_NEAR(e.us, ratio * nt * static_cast<double>(e.ops), 1e-9 * e.us) << label;
      ++t.weight_grads;
    } else {
      EXPECT_NEAR(e.us, ratio * it->second.us, 1e-9 * it->second.us) << label;
    }
    t.bf16_us += it->second.us;
    t.fp8_us += e.us;
    ++t.calls;
  }
  return t;
}

double op_bytes(const CostLog& log, const char* op, int64_t* ops = nullptr) {
  double bytes = 0;
  for (const auto& [key, e] : log)
    if (key.second == op) {
      bytes += e.bytes;
      if (ops) *ops += e.ops;
    }
  return bytes;
}

// Tensorwise on the ideal calibration (fp8 at 0.6 of the bf16 time here): each of the 24 fp8
// GEMMs a step (4 Linears x 3 GEMMs x 2 blocks) is its bf16 call's time x 0.6 (dW's in the nt
// layout it runs in), the head's GEMMs are unchanged. One operand is transposed into
// cuBLASLt's layout: dX's weight (in x out bytes, read and written); the weight grad reads
// the transposed codes its casts wrote.
TEST(SimFp8, TensorwiseGemmsTakeTheCalibratedRatioOfTheirBf16Time) {
  Calibration cal = ideal_calibration(1000, 100, 100);
  cal.fp8.tensorwise = 0.6;
  const runtime::TrainConfig c = llama_like(Fp8Recipe::Tensorwise);
  const CostLog bf16 = simulate(cal, 1, llama_like(Fp8Recipe::None));
  const CostLog fp8 = simulate(cal, 1, c);
  const GemmTotals t = pair_gemms(cal, bf16, fp8, 0.6, kBlock, 256);
  EXPECT_EQ(t.calls, 4 * 3 * 2);  // one cost-log entry per call site, summed over the steps
  EXPECT_EQ(t.weight_grads, 4 * 2);
  EXPECT_GT(t.bf16_us, 0);
  EXPECT_GT(t.head_us, 0);
  EXPECT_NEAR(t.other_bf16_us, t.head_us, 1e-9 * t.head_us);
  double bf16_total = 0;
  for (const auto& [key, e] : bf16)
    if (starts_with(key.second, "gemm_")) bf16_total += e.us;
  EXPECT_NEAR(bf16_total, t.bf16_us + t.head_us, 1e-9 * bf16_total);  // nothing left unpaired
  double per_step = 0;
  for (const Linear& l : kBlock) per_step += 2 * l.in * l.out;
  int64_t transposes = 0;
  EXPECT_EQ(op_bytes(fp8, "fp8_transpose", &transposes), per_step * 2 * c.steps);
  EXPECT_EQ(transposes, 4 * 2 * c.steps);  // dX's weight, per Linear
}

// The committed H200 calibration at llama1b's shape (22 blocks, 8192 tokens, 1 GPU): the
// blocks' fp8 GEMMs take gemm.fp8.tensorwise (0.5086: the GEMM floors' 0.5662 scaled by the
// traced 3.0B step's fp8 GEMMs in-step, bench/calibrations/make_h200.sh) of their bf16 time,
// call by call.
TEST(SimFp8, TheH200CalibrationsRatioAtLlama1bsShape) {
  std::string path = FSDP_SOURCE_DIR;
  path += "/bench/calibrations/h200.json";  // not operator+: GCC 12 warns wrongly (-Warray-bounds)
  const Calibration cal = read_calibration(path);
  ASSERT_EQ(cal.fp8.tensorwise, 0.5086);
  runtime::TrainConfig c = llama_like(Fp8Recipe::Tensorwise);
  c.model.layers = 22;
  c.model.dim = 2048;
  c.model.heads = 32;
  c.model.kv_heads = 4;
  c.model.ffn_dim = 5632;
  c.model.seq_len = 2048;
  c.model.vocab = 32000;
  c.tokens = 8192;
  runtime::TrainConfig none = c;
  none.fp8 = Fp8Recipe::None;
  constexpr Linear kLlama1b[] = {{2048, 2560}, {2048, 2048}, {2048, 11264}, {5632, 2048}};
  const GemmTotals t =
      pair_gemms(cal, simulate(cal, 1, none), simulate(cal, 1, c), 0.5086, kLlama1b, 8192);
  EXPECT_EQ(t.calls, 4 * 3 * 22);
  EXPECT_EQ(t.weight_grads, 4 * 22);
  EXPECT_NEAR(t.other_bf16_us, t.head_us, 1e-9 * t.head_us);
}

// Rowwise where cuBLASLt takes no outer-vector scales: every fp8 GEMM also fills a unit scale
// and runs the fp32 pass (m x n fp32 read, bf16 written, m + n scales read).
TEST(SimFp8, RowwiseWithoutOuterVectorScalesAddsTheFp32Pass) {
  Calibration cal = ideal_calibration(1000, 100, 100);
  const runtime::TrainConfig c = llama_like(Fp8Recipe::Rowwise);
  int64_t passes = 0;
  EXPECT_EQ(op_bytes(simulate(cal, 1, c), "fp8_scale_outer", &passes), 0);
  cal.fp8.rowwise_outer_vector = false;
  const CostLog log = simulate(cal, 1, c);
  double per_step = 0;
  for (const Linear& l : kBlock)  // fwd [tokens, out], dX [tokens, in], dW [out, in]
    for (const auto& [m, n] : {std::pair{256.0, l.out}, {256.0, l.in}, {l.out, l.in}})
      per_step += m * n * (4 + 2) + 4 * (m + n);
  EXPECT_EQ(op_bytes(log, "fp8_scale_outer", &passes), per_step * 2 * c.steps);
  EXPECT_EQ(passes, 3 * 4 * 2 * c.steps);
}

// The float8 all-gather on 2 simulated GPUs, the tiny transformer of the CPU backend's
// Fp8AllGather.HalvesTheWeightsBytesPerCollective: a block's all-gather moves 2 x 3520 bytes
// instead of 2 x 6976 (the weights' 6912 bytes a rank halved, the norms' 64 unchanged), the
// root's is unchanged, and one 32-byte max all-reduce of the amaxes runs a step.
TEST(SimFp8, TheFloat8AllGatherHalvesTheWeightsBytesAndAddsOneAmaxAllReduce) {
  const Calibration cal = ideal_calibration(1000, 100, 100);
  runtime::TrainConfig c = testing::tiny_transformer_config(3);
  c.collect_params = false;
  c.param_dtype = DType::BF16;
  c.fp8 = Fp8Recipe::Tensorwise;
  const CostLog fp8 = simulate(cal, 2, c);
  c.fp8_all_gather = false;
  const CostLog bf16 = simulate(cal, 2, c);
  int blocks = 0, roots = 0;
  for (const auto& [key, e] : bf16) {
    if (key.second != "all_gather") continue;
    const auto it = fp8.find(key);
    ASSERT_TRUE(it != fp8.end()) << key.first;
    EXPECT_EQ(it->second.ops, e.ops) << key.first;
    if (starts_with(key.first, "AG layers.")) {
      EXPECT_EQ(e.bytes, 2.0 * 6976 * e.ops) << key.first;
      EXPECT_EQ(it->second.bytes, 2.0 * 3520 * e.ops) << key.first;
      EXPECT_EQ(e.ops, 2 * c.steps) << key.first;  // forward and backward
      ++blocks;
    } else {
      EXPECT_EQ(it->second.bytes, e.bytes) << key.first << ": the root's";
      ++roots;
    }
  }
  EXPECT_EQ(blocks, 2);
  EXPECT_EQ(roots, 1);
  int64_t fp8_reduces = 0, bf16_reduces = 0;
  for (const auto& [key, e] : fp8)
    if (key.second == "all_reduce" && starts_with(key.first, "AR fp8 amax")) {
      fp8_reduces += e.ops;
      EXPECT_EQ(e.bytes, 4.0 * 4 * 2 * static_cast<double>(e.ops)) << key.first;  // 8 amaxes
    }
  for (const auto& [key, e] : bf16)
    if (starts_with(key.first, "AR fp8 amax")) bf16_reduces += e.ops;
  EXPECT_EQ(fp8_reduces, c.steps);
  EXPECT_EQ(bf16_reduces, 0);
  // The reduce-scatters are unchanged.
  EXPECT_EQ(op_bytes(fp8, "reduce_scatter"), op_bytes(bf16, "reduce_scatter"));
  EXPECT_GT(op_bytes(bf16, "reduce_scatter"), 0);
}

// A calibration without an fp8 rate refuses --fp8 in one line before anything runs.
TEST(SimFp8, ACalibrationWithoutAnFp8RateRefusesFp8) {
  Calibration cal = ideal_calibration(1000, 100, 100);
  cal.source = "c.json";
  cal.fp8.rowwise = 0;
  try {
    simulate(cal, 1, llama_like(Fp8Recipe::Rowwise));
    FAIL() << "no error";
  } catch (const OptionError& e) {
    EXPECT_EQ(e.spelled([](const std::string& o) { return "--" + o; }),
              "--fp8 rowwise cannot be simulated with calibration 'c.json': it has no fp8 GEMM "
              "rate (gemm.fp8.rowwise)");
  }
}

}  // namespace
}  // namespace fsdp::sim
