// The transformer's modules on the CPU backend: every module's backward (param grads and input
// grad) against central finite differences of its forward in fp32, and the model's parameter
// names, counts, FLOPs, init and synthetic tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"
#include "fsdp/error.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/nn/model.h"
#include "models/model_family.h"

namespace fsdp::nn {
namespace {

using cpu::cpu_test::download;
using cpu::cpu_test::Floats;

Floats values(int64_t n, float scale, float offset, int salt) {
  Floats v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = offset + scale * std::sin(0.61f * i + 0.9f * salt + 0.2f);
  return v;
}

double rel_error(const Floats& a, const Floats& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(d / std::max(n, 1e-30));
}

// fp32 forward, eps 1e-2 on O(0.1..1) values. The measured errors are below 5e-4 for single
// modules and up to 2e-3 for the whole model's second layer, whose gradients are small beside
// the fp32 forward's rounding noise / (2 eps); a wrong backward gives 2e-2 or more.
constexpr double kFiniteDifferenceTol = 5e-3;
constexpr float kEps = 1e-2f;

// The small shapes of the finite-difference checks: 2 sequences of 4 tokens, 4 query heads
// sharing 2 kv heads (head_dim 4).
TransformerConfig small_config() {
  TransformerConfig c;
  c.layers = 2;
  c.dim = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_dim = 24;
  c.seq_len = 4;
  c.vocab = 11;
  c.seed = 7;
  return c;
}

class TransformerModules : public testing::Test {
 protected:
  cpu::CpuWorld world{1, {}};
  std::unique_ptr<Device> dev = world.make_device(0);
  Stream s = dev->create_stream("s", StreamPriority::Normal);
  RunContext ctx{dev.get(), s, DType::F32};
  static constexpr int64_t kTokens = 8;

  // Every param of m gets O(0.3) values (norm weights around 1), on the device.
  std::vector<Floats> load_params(Module& m) {
    std::vector<Floats> host;
    int salt = 0;
    for (Param* p : m.all_params()) {
      const bool norm = p->shape().size() == 1;
      host.push_back(values(p->numel(), norm ? 0.2f : 0.3f, norm ? 1.0f : 0.0f, ++salt));
      p->value = empty_tensor(*dev, s, DType::F32, p->rows(), p->cols(), MemTag::ShardedState);
      set_param(*p, host.back());
    }
    return host;
  }
  void set_param(Param& p, const Floats& v) {
    dev->copy_from_host(s, p.value.data, v.data(), v.size() * sizeof(float));
  }
  Tensor input(const Floats& x, int64_t cols) {
    Tensor t = empty_tensor(*dev, s, DType::F32, static_cast<int64_t>(x.size()) / cols, cols,
                            MemTag::Activation);
    dev->copy_from_host(s, t.data, x.data(), x.size() * sizeof(float));
    return t;
  }
  Tensor token_ids(const std::vector<int32_t>& ids) {
    Tensor t = empty_tensor(*dev, s, DType::I32, static_cast<int64_t>(ids.size()), 1,
                            MemTag::Activation);
    dev->copy_from_host(s, t.data, ids.data(), ids.size() * sizeof(int32_t));
    return t;
  }
  // L = sum(r * m(x)) in double.
  double loss(Module& m, const Tensor& x, const Floats& r) {
    Tensor y = m.forward(ctx, x);
    const Floats out = download(*dev, s, y.data, y.numel(), DType::F32);
    EXPECT_EQ(out.size(), r.size());
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += static_cast<double>(r[i]) * out[i];
    return l;
  }

  // Backward of m at x with dL/dy = r, against central differences: every param (every
  // `stride`-th element) and, for float inputs, the input.
  void check_gradients(Module& m, const Floats& x_host, int64_t x_cols, const Tensor& ids,
                       int64_t out_cols, int stride = 1) {
    std::vector<Floats> params = load_params(m);
    const bool float_input = !ids.defined();
    Tensor x = float_input ? input(x_host, x_cols) : ids;
    const Floats r = values(kTokens * out_cols, 1.0f, 0.0f, 99);
    for (Param* p : m.all_params()) p->grad = Tensor{};
    m.forward(ctx, x);
    Tensor dx = m.backward(ctx, input(r, out_cols), float_input);
    std::vector<Param*> ps = m.all_params();
    for (size_t i = 0; i < ps.size(); ++i) {
      ASSERT_TRUE(ps[i]->grad.defined()) << m.fqn() << " param " << i << " got no gradient";
      const Floats analytic = download(*dev, s, ps[i]->grad.data, ps[i]->numel(), DType::F32);
      Floats a, numeric;
      Floats& v = params[i];
      for (size_t j = 0; j < v.size(); j += stride) {
        const float keep = v[j];
        v[j] = keep + kEps;
        set_param(*ps[i], v);
        const double up = loss(m, x, r);
        v[j] = keep - kEps;
        set_param(*ps[i], v);
        const double down = loss(m, x, r);
        v[j] = keep;
        set_param(*ps[i], v);
        numeric.push_back(static_cast<float>((up - down) / (2 * kEps)));
        a.push_back(analytic[j]);
      }
      EXPECT_LE(rel_error(a, numeric), kFiniteDifferenceTol)
          << "param " << i << " " << ps[i]->name() << " of " << m.type();
    }
    if (!float_input) {
      EXPECT_FALSE(dx.defined()) << "token ids have no gradient";
      return;
    }
    ASSERT_TRUE(dx.defined());
    const Floats analytic = download(*dev, s, dx.data, dx.numel(), DType::F32);
    Floats xv = x_host, numeric;
    for (size_t j = 0; j < xv.size(); ++j) {
      const float keep = xv[j];
      xv[j] = keep + kEps;
      const double up = loss(m, input(xv, x_cols), r);
      xv[j] = keep - kEps;
      const double down = loss(m, input(xv, x_cols), r);
      xv[j] = keep;
      numeric.push_back(static_cast<float>((up - down) / (2 * kEps)));
    }
    EXPECT_LE(rel_error(analytic, numeric), kFiniteDifferenceTol) << "input grad of " << m.type();
  }
};

// ---- finite differences

TEST_F(TransformerModules, EmbeddingBackwardMatchesFiniteDifferences) {
  const TransformerConfig c = small_config();
  Embedding m(c.vocab, c.dim, 1);
  check_gradients(m, {}, 0, token_ids({3, 0, 3, 10, 5, 3, 0, 7}), c.dim);
}

TEST_F(TransformerModules, RmsNormBackwardMatchesFiniteDifferences) {
  const TransformerConfig c = small_config();
  RMSNorm m(c.dim, c.norm_eps);
  check_gradients(m, values(kTokens * c.dim, 1.0f, 0.0f, 1), c.dim, {}, c.dim);
}

TEST_F(TransformerModules, AttentionBackwardMatchesFiniteDifferences) {
  const TransformerConfig c = small_config();
  Attention m(c, 0);
  check_gradients(m, values(kTokens * c.dim, 1.0f, 0.0f, 2), c.dim, {}, c.dim);
}

TEST_F(TransformerModules, FeedForwardBackwardMatchesFiniteDifferences) {
  const TransformerConfig c = small_config();
  FeedForward m(c.dim, c.ffn_dim, 3, 0.02f);
  check_gradients(m, values(kTokens * c.dim, 1.0f, 0.0f, 3), c.dim, {}, c.dim);
}

TEST_F(TransformerModules, TransformerBlockBackwardMatchesFiniteDifferences) {
  const TransformerConfig c = small_config();
  TransformerBlock m(c, 1);
  check_gradients(m, values(kTokens * c.dim, 1.0f, 0.0f, 4), c.dim, {}, c.dim, /*stride=*/2);
}

TEST_F(TransformerModules, WholeModelBackwardMatchesFiniteDifferences) {
  const TransformerConfig c = small_config();
  ModelConfig mc;
  mc.kind = "transformer";
  mc.layers = c.layers;
  mc.dim = c.dim;
  mc.heads = c.heads;
  mc.kv_heads = c.kv_heads;
  mc.ffn_dim = c.ffn_dim;
  mc.seq_len = c.seq_len;
  mc.vocab = c.vocab;
  std::unique_ptr<Model> m_built = models::build_model(mc);
  Model& m = *m_built;
  check_gradients(m, {}, 0, token_ids({1, 4, 4, 9, 0, 2, 10, 4}), c.vocab, /*stride=*/3);
}

// ---- activation checkpointing

// Note [Activation checkpointing]: a fully checkpointed block's recompute stops early. Its FFN
// output projection's GEMM and its last residual add make only the block's output, which
// backward never reads, so each runs once (in forward); every other op runs twice. The
// input grad and the param grads are bitwise those of the block without checkpointing.
TEST_F(TransformerModules, AFullRecomputeSkipsTheWorkThatOnlyMakesTheBlocksOutput) {
  const TransformerConfig c = small_config();
  auto run = [&](ActivationCheckpoint mode, Timeline* timeline) {
    TransformerBlock m(c, 1);
    m.set_activation_checkpoint(mode);
    load_params(m);
    Tensor x = input(values(kTokens * c.dim, 1.0f, 0.0f, 5), c.dim);
    Tensor dy = input(values(kTokens * c.dim, 1.0f, 0.0f, 6), c.dim);
    dev->synchronize();
    dev->enable_timeline(true);
    m.forward(ctx, x);
    Tensor dx = m.backward(ctx, dy);
    *timeline = dev->take_timeline();
    dev->enable_timeline(false);
    std::vector<Floats> grads{download(*dev, s, dx.data, dx.numel(), DType::F32)};
    for (Param* p : m.all_params()) grads.push_back(download(*dev, s, p->grad.data, p->numel(), DType::F32));
    return grads;
  };
  Timeline none_ops, full_ops;
  const std::vector<Floats> none = run(ActivationCheckpoint::None, &none_ops);
  const std::vector<Floats> full = run(ActivationCheckpoint::Full, &full_ops);
  EXPECT_EQ(full, none);
  auto count = [](const Timeline& t, const std::string& label) {
    return std::count_if(t.ops.begin(), t.ops.end(),
                         [&](const TimelineOp& op) { return op.label == label; });
  };
  for (const char* once : {"fwd feed_forward.w2 gemm", "fwd root residual"}) {
    EXPECT_EQ(count(none_ops, once), 1) << once;
    EXPECT_EQ(count(full_ops, once), 1) << once;
  }
  for (const char* twice : {"fwd feed_forward.w13 gemm", "fwd feed_forward swiglu",
                            "fwd attention.wo gemm", "fwd ffn_norm residual+rmsnorm"}) {
    EXPECT_EQ(count(none_ops, twice), 1) << twice;
    EXPECT_EQ(count(full_ops, twice), 2) << twice;
  }
}

// ---- the model's names, sizes and init

ModelConfig llama_like(int layers) {
  ModelConfig mc;
  mc.kind = "transformer";
  mc.layers = layers;
  mc.dim = 64;
  mc.heads = 4;
  mc.kv_heads = 2;
  mc.ffn_dim = 192;
  mc.seq_len = 32;
  mc.vocab = 256;
  return mc;
}

TEST(TransformerModel, ParamNamesAndShapesAreTheSharedFqns) {
  std::unique_ptr<Model> m_built = models::build_model(llama_like(2));
  Model& m = *m_built;
  std::vector<std::string> got;
  m.visit([&](Module& mod) {
    for (const auto& p : mod.params()) {
      std::string shape;
      for (int64_t d : p->shape()) {
        if (!shape.empty()) shape += 'x';
        shape += std::to_string(d);
      }
      got.push_back(mod.fqn() + "." + p->name() + " " + shape);
    }
  });
  std::vector<std::string> expect = {"tok_embeddings.weight 256x64"};
  for (int i = 0; i < 2; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    expect.push_back(l + "attention_norm.weight 64");
    expect.push_back(l + "attention.wqkv.weight 128x64");  // (4 + 2*2) heads of 16
    expect.push_back(l + "attention.wo.weight 64x64");
    expect.push_back(l + "ffn_norm.weight 64");
    expect.push_back(l + "feed_forward.w13.weight 384x64");
    expect.push_back(l + "feed_forward.w2.weight 64x192");
  }
  expect.push_back("norm.weight 64");
  expect.push_back("output.weight 256x64");
  EXPECT_EQ(got, expect);
  ASSERT_EQ(m.blocks().size(), 2u);
  EXPECT_EQ(m.blocks()[1]->fqn(), "layers.1");
  EXPECT_TRUE(m.uses_cross_entropy());
  EXPECT_EQ(m.output_dim(), 256);
}

TEST(TransformerModel, ParamCountAndFlopsFollowTheStatedFormulas) {
  const ModelConfig mc = llama_like(2);
  std::unique_ptr<Model> m_built = models::build_model(mc);
  Model& m = *m_built;
  const TransformerConfig c = transformer_config(mc);
  // per layer: wqkv 64*8*16 = 8192, wo 4096, w13 + w2 3*64*192 = 36864, norms 128 -> 49280
  EXPECT_EQ(transformer_param_count(c), 2 * 256 * 64 + 64 + 2 * 49280);
  EXPECT_EQ(m.param_count(), transformer_param_count(c));
  // 6 * (131392 - 256*64) + 12 * 2 layers * 64 * 32 tokens
  EXPECT_EQ(transformer_flops_per_token(c), 6.0 * (131392 - 16384) + 12.0 * 2 * 64 * 32);
  // The ~1B benchmark model (llama1b, docs/performance.md).
  TransformerConfig big;
  big.layers = 22, big.dim = 2048, big.heads = 32, big.kv_heads = 4, big.ffn_dim = 5632;
  big.seq_len = 2048, big.vocab = 32000;
  EXPECT_EQ(transformer_param_count(big), 1'100'048'384);
}

TEST(TransformerModel, DefaultsResolveAndBadSizesGiveOneLineErrors) {
  ModelConfig mc = llama_like(1);
  mc.kv_heads = 0;
  mc.ffn_dim = 0;
  const TransformerConfig c = transformer_config(mc);
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_EQ(c.ffn_dim, 192);  // 8 * 64 / 3 = 170.7, up to a multiple of 64
  auto error_of = [](ModelConfig bad) -> std::string {
    try {
      models::build_model(bad);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  ModelConfig bad = llama_like(1);
  bad.heads = 3;
  EXPECT_NE(error_of(bad).find("dim (64) must be a multiple of heads (3)"), std::string::npos);
  bad = llama_like(1);
  bad.kv_heads = 3;
  EXPECT_NE(error_of(bad).find("heads (4) must be a multiple of kv_heads (3)"),
            std::string::npos);
  bad = llama_like(1);
  bad.heads = 64;  // head_dim 1
  EXPECT_NE(error_of(bad).find("must be even"), std::string::npos);
  bad = llama_like(1);
  bad.vocab = 0;
  EXPECT_NE(error_of(bad).find("must be positive"), std::string::npos);
}

double mean_of(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += x;
  return s / static_cast<double>(v.size());
}
double std_of(const std::vector<float>& v) {
  const double m = mean_of(v);
  double s = 0;
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

TEST(TransformerModel, InitIsNormalWithDepthScaledResidualProjections) {
  std::unique_ptr<Model> m_built = models::build_model(llama_like(2));
  Model& m = *m_built;
  std::vector<std::pair<std::string, const Param*>> params;
  m.visit([&](Module& mod) {
    for (const auto& p : mod.params()) params.push_back({mod.fqn() + "." + p->name(), p.get()});
  });
  for (const auto& [name, p] : params) {
    const std::vector<float>& v = p->init_values();
    if (p->shape().size() == 1) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << name;
      continue;
    }
    double expect_std = 0.02;
    if (name.find(".wo.") != std::string::npos || name.find(".w2.") != std::string::npos)
      expect_std = name.find("layers.0.") == 0 ? 0.02 / std::sqrt(2.0) : 0.02 / 2.0;
    // 4096..98304 samples: the sample std is within 3% of the truth by a wide margin.
    EXPECT_NEAR(std_of(v), expect_std, 0.03 * expect_std) << name;
    EXPECT_NEAR(mean_of(v), 0.0, 4 * expect_std / std::sqrt(static_cast<double>(v.size())))
        << name;
  }
  // Deterministic from the seed; a different seed, different values; layers differ.
  std::unique_ptr<Model> again_built = models::build_model(llama_like(2));
  Model& again = *again_built;
  ModelConfig other = llama_like(2);
  other.seed = 2;
  std::unique_ptr<Model> reseeded_built = models::build_model(other);
  Model& reseeded = *reseeded_built;
  const auto a = m.all_params(), b = again.all_params(), r = reseeded.all_params();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]->init_values(), b[i]->init_values());
  EXPECT_NE(a[0]->init_values(), r[0]->init_values());
  EXPECT_NE(a[2]->init_values(), a[8]->init_values());  // layers.0 vs layers.1 wqkv
}

TEST(TransformerModel, NormalInitHasTheNormalsShape) {
  const std::vector<float> v = normal_init(42, 100001, 1.0f);  // odd: the last pair is half used
  EXPECT_NEAR(mean_of(v), 0.0, 0.015);
  EXPECT_NEAR(std_of(v), 1.0, 0.01);
  int64_t within_one = 0, within_two = 0;
  for (float x : v) within_one += std::abs(x) < 1.0f, within_two += std::abs(x) < 2.0f;
  EXPECT_NEAR(within_one / 100001.0, 0.6827, 0.005);
  EXPECT_NEAR(within_two / 100001.0, 0.9545, 0.003);
  EXPECT_EQ(normal_init(42, 7, 1.0f), std::vector<float>(v.begin(), v.begin() + 7));
}

TEST(TransformerModel, SyntheticTokensAreNextTokenPairsAndAnySliceOfTheGlobalBatch) {
  ModelConfig mc = llama_like(1);
  mc.seq_len = 8;
  mc.vocab = 50;
  const TokenBatch all = make_token_batch(mc, 3, 5, 0, 32);
  ASSERT_EQ(all.ids.size(), 32u);
  ASSERT_EQ(all.labels.size(), 32u);
  int follows_rule = 0;
  for (int64_t r = 0; r < 32; ++r) {
    EXPECT_TRUE(all.ids[r] >= 0 && all.ids[r] < 50);
    EXPECT_TRUE(all.labels[r] >= 0 && all.labels[r] < 50);
    if (r % 8 != 7) {
      EXPECT_EQ(all.labels[r], all.ids[r + 1]) << "row " << r;
    }
    follows_rule += all.labels[r] == (all.ids[r] * 5 + 3) % 50;
  }
  EXPECT_GE(follows_rule, 16);  // about 3/4 of 32
  EXPECT_LE(follows_rule, 30);
  // A rank's slice is the same rows of the global batch.
  const TokenBatch slice = make_token_batch(mc, 3, 5, 16, 8);
  EXPECT_EQ(slice.ids, std::vector<int32_t>(all.ids.begin() + 16, all.ids.begin() + 24));
  EXPECT_EQ(slice.labels, std::vector<int32_t>(all.labels.begin() + 16, all.labels.begin() + 24));
  EXPECT_NE(make_token_batch(mc, 3, 6, 0, 32).ids, all.ids);  // another step
  try {
    make_token_batch(mc, 3, 5, 0, 12);
    ADD_FAILURE() << "12 tokens are not whole sequences of 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokens (12) must be a multiple of seq_len (8)"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace fsdp::nn
