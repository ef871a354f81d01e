// The MoE layer's grouped GEMM (Note [Grouped GEMM]): cuBLAS's grouped-batched call on CUDA
// against the CPU backend's per-group GEMMs, for the three transposes the experts use, with
// groups of no rows (an expert without tokens) and of k = 0 (its weight grad: zeros). The
// capacity-factor routing (Note [Device MoE routing]): the CUDA kernels against the CPU
// backend's loops, which equal the host routing (tests/test_moe_device_routing.cpp). The
// experts in fp8 (Note [Fp8 experts]): CUDA's padded per-expert fp8 GEMMs against the CPU's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "../grouped_experts_case.h"
#include "../moe_routing_cases.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "fsdp/nn/moe.h"

namespace fsdp {
namespace {

struct Shape {
  int64_t m, n, k;
};

// Every group's C (fp32 on the host, concatenated) for random A and B made on `d`.
std::vector<float> grouped_on(Device& d, bool trans_a, bool trans_b, const std::vector<Shape>& shapes,
                              DType t) {
  const Stream s = d.create_stream("compute", StreamPriority::Normal);
  std::vector<Device::GemmGroup> groups;
  std::vector<void*> owned;
  int64_t total_c = 0;
  uint64_t seed = 21;
  for (const Shape& sh : shapes) {
    void* a = d.alloc(static_cast<size_t>(sh.m * sh.k + 1) * dtype_size(t), s, MemTag::Other);
    void* b = d.alloc(static_cast<size_t>(sh.n * sh.k + 1) * dtype_size(t), s, MemTag::Other);
    void* c = d.alloc(static_cast<size_t>(sh.m * sh.n + 1) * dtype_size(t), s, MemTag::Other);
    if (sh.m * sh.k > 0) d.synthetic_batch(s, a, t, sh.m, sh.k, seed++, 0, 0, 1.0f);
    if (sh.n * sh.k > 0) d.synthetic_batch(s, b, t, sh.n, sh.k, seed++, 0, 0, 1.0f);
    d.fill(s, c, t, sh.m * sh.n + 1, std::nanf(""));  // every element of C must be written
    groups.push_back({sh.m, sh.n, sh.k, a, b, c});
    owned.insert(owned.end(), {a, b, c});
    total_c += sh.m * sh.n;
  }
  d.grouped_gemm(s, trans_a, trans_b, groups.data(), static_cast<int>(groups.size()), t, t);
  std::vector<float> out;
  for (const Device::GemmGroup& g : groups) {
    if (g.m * g.n == 0) continue;
    void* c32 = d.alloc(static_cast<size_t>(g.m * g.n) * 4, s, MemTag::Other);
    d.cast(s, c32, DType::F32, g.c, t, g.m * g.n);
    std::vector<float> part(static_cast<size_t>(g.m * g.n));
    d.copy_to_host(s, part.data(), c32, part.size() * 4);
    d.synchronize();
    d.free(c32, s);
    out.insert(out.end(), part.begin(), part.end());
  }
  EXPECT_EQ(static_cast<int64_t>(out.size()), total_c);
  for (void* p : owned) d.free(p, s);
  d.synchronize();
  return out;
}

TEST(CudaMoe, GroupedGemmMatchesTheCpuBackendPerGroup) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  // forward (x w^T), input grad (dy w), weight grad (dy^T x): the experts' three forms.
  const struct {
    bool trans_a, trans_b;
    std::vector<Shape> shapes;
  } cases[] = {
      {false, true, {{37, 48, 32}, {0, 48, 32}, {5, 48, 32}, {64, 48, 32}}},
      {false, false, {{37, 32, 48}, {0, 32, 48}, {5, 32, 48}, {64, 32, 48}}},
      {true, false, {{32, 48, 37}, {32, 48, 0}, {32, 48, 5}, {32, 48, 64}}},
  };
  for (DType t : {DType::F32, DType::BF16})
    for (const auto& c : cases) {
      cpu::CpuWorld world(1, {});
      auto cpu_device = world.make_device(0);
      auto cuda_device = cuda::make_device(0);
      const std::vector<float> want = grouped_on(*cpu_device, c.trans_a, c.trans_b, c.shapes, t);
      const std::vector<float> got = grouped_on(*cuda_device, c.trans_a, c.trans_b, c.shapes, t);
      ASSERT_EQ(got.size(), want.size());
      double diff = 0, norm = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_FALSE(std::isnan(got[i])) << "element " << i << " not written";
        diff += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
      }
      EXPECT_LE(std::sqrt(diff / norm), t == DType::F32 ? 1e-5 : 1e-2)
          << dtype_name(t) << " trans_a " << c.trans_a << " trans_b " << c.trans_b;
    }
}

// Everything bitwise but the aux loss, whose double sums over tokens the GPU adds in a tree
// (the CPU in token order): equal to the last bits of a double, so to fp32 rounding. Small
// cases, then cases of hundreds of tokens per group (several tiles of the per-expert scan).
TEST(CudaMoe, RoutingMatchesTheCpuBackend) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  using moe_routing_test::Case;
  cpu::CpuWorld world(1, {});
  auto cpu_device = world.make_device(0);
  auto cuda_device = cuda::make_device(0);
  const Stream cpu_s = cpu_device->create_stream("compute", StreamPriority::Normal);
  const Stream cuda_s = cuda_device->create_stream("compute", StreamPriority::Normal);
  std::mt19937 rng(1201);
  for (int i = 0; i < 120; ++i) {
    const bool large = i >= 100;
    const Case c = moe_routing_test::make_case(rng, large ? 16 : 9, large ? 700 : 12);
    const int64_t capacity = moe_routing_test::config_of(c).capacity(c.group);
    std::vector<float> dsend_weight(static_cast<size_t>(c.experts * capacity * c.groups));
    for (float& v : dsend_weight) v = std::uniform_real_distribution<float>(-1, 1)(rng);
    const auto want = moe_routing_test::route_on_device(*cpu_device, cpu_s, c, capacity, dsend_weight);
    const auto got = moe_routing_test::route_on_device(*cuda_device, cuda_s, c, capacity, dsend_weight);
    SCOPED_TRACE(::testing::Message() << "case " << i << ": E " << c.experts << " K " << c.top_k
                                      << " group " << c.group << " x " << c.groups << " cf "
                                      << c.capacity_factor);
    EXPECT_EQ(got.chosen, want.chosen);
    EXPECT_EQ(got.weight, want.weight);
    EXPECT_EQ(got.slot, want.slot);
    EXPECT_EQ(got.send_assignment, want.send_assignment);
    EXPECT_EQ(got.send_token, want.send_token);
    EXPECT_EQ(got.send_weight, want.send_weight);
    EXPECT_EQ(got.aux_grad, want.aux_grad);
    EXPECT_NEAR(got.stats[0], want.stats[0], 1e-6 * std::abs(want.stats[0]));
    EXPECT_EQ(got.stats[1], want.stats[1]);
    EXPECT_EQ(got.dprobs, want.dprobs);
    if (::testing::Test::HasFailure()) return;
  }
}

// The grouped experts' fp8 forward, input grad and weight grads on CUDA against the CPU
// backend's, both recipes, with counts that are not multiples of 16 and an empty expert. The
// two differ by the fp8 GEMMs' accumulation order, which can move a cast code by one step: a
// relative L2 error of 3% at most (measured on the H200: below 1%), where a lost pad row or
// a wrong scale is O(1).
TEST(CudaMoe, Fp8ExpertsMatchTheCpuBackend) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const int64_t dim = 64, ffn = 32;
  const std::vector<int64_t> counts{37, 0, 100, 16};
  int64_t rows = 0;
  for (int64_t n : counts) rows += n;
  auto run_on = [&](Device& d, Fp8Recipe recipe) {
    const Stream s = d.create_stream("compute", StreamPriority::Normal);
    RunContext ctx{&d, s, DType::BF16};
    const std::unique_ptr<nn::GroupedExperts> made = testing::four_experts(dim, ffn, 9);
    nn::GroupedExperts& experts = *made;
    uint64_t seed = 40;
    auto random = [&](int64_t r, int64_t c, float scale) {
      Tensor t = empty_tensor(d, s, DType::BF16, r, c, MemTag::Other);
      d.synthetic_batch(s, t.data, DType::BF16, r, c, seed++, 0, 0, scale);
      return t;
    };
    for (Param* p : experts.all_params()) {
      p->value = random(p->rows(), p->cols(), 0.2f);
      p->fp8 = recipe;
    }
    experts.counts = counts;
    const Tensor x = random(rows, dim, 1.0f), dy = random(rows, dim, 0.5f);
    std::vector<Tensor> outs{experts.forward(ctx, x)};
    outs.push_back(experts.backward(ctx, dy, true));
    for (Param* p : experts.all_params()) outs.push_back(p->grad);
    std::vector<std::vector<float>> host;
    for (const Tensor& t : outs) {
      Tensor f = empty_tensor(d, s, DType::F32, t.rows, t.cols, MemTag::Other);
      d.cast(s, f.data, DType::F32, t.data, t.dtype, t.numel());
      host.emplace_back(static_cast<size_t>(t.numel()));
      d.copy_to_host(s, host.back().data(), f.data, host.back().size() * 4);
      d.synchronize();
    }
    return host;
  };
  for (Fp8Recipe recipe : {Fp8Recipe::Tensorwise, Fp8Recipe::Rowwise}) {
    cpu::CpuWorld world(1, {});
    auto cpu_device = world.make_device(0);
    auto cuda_device = cuda::make_device(0);
    const auto want = run_on(*cpu_device, recipe);
    const auto got = run_on(*cuda_device, recipe);
    const char* names[] = {"out", "dx", "dw13", "dw2"};
    ASSERT_EQ(got.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_EQ(got[i].size(), want[i].size());
      double diff = 0, norm = 0;
      for (size_t j = 0; j < want[i].size(); ++j) {
        diff += (got[i][j] - want[i][j]) * (got[i][j] - want[i][j]);
        norm += want[i][j] * want[i][j];
      }
      ASSERT_GT(norm, 0) << names[i];
      const double rel = std::sqrt(diff / norm);
      std::printf("fp8 experts %s %s: relative L2 error %.2e\n", fp8_recipe_name(recipe), names[i], rel);
      EXPECT_LE(rel, 3e-2) << fp8_recipe_name(recipe) << " " << names[i];
    }
  }
}

}  // namespace
}  // namespace fsdp
