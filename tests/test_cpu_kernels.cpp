// Tests of the CPU backend's compute kernels (src/backend/cpu/cpu_kernels), each against a
// straightforward host reference: copy-in/out, optimizers, losses, softmax, gemm, elementwise
// and row ops. Streams, events, memory and collectives are in test_cpu_backend.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "cpu_test_util.h"
#include "fsdp/error.h"

namespace fsdp::cpu {
namespace {

using cpu_test::download;
using cpu_test::Floats;
using cpu_test::round_to;
using cpu_test::upload;

// ---- kernels, against straightforward references

class CpuBackendKernels : public cpu_test::DeviceTest {};

Floats ramp(int64_t n, float scale, float shift) {
  Floats v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(scale * i + shift) * 2;
  return v;
}

TEST_F(CpuBackendKernels, CopyInAndCopyOutRoundTripOddShapes) {
  const int w = 3;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{17, 257}, {5, 3}, {7, 1}, {1, 4}};
  std::vector<ShardSlice> slices;
  int64_t packed = 0;
  for (auto [rows, cols] : shapes) {
    slices.push_back({rows, cols, (rows + w - 1) / w, packed});
    packed += slices.back().rows_per_rank * cols;
  }
  const int count = static_cast<int>(shapes.size());
  // gap: elements at the end of the shard that no param covers; they must come out zero.
  for (auto [rs_t, gap] : {std::pair{DType::F32, 0}, {DType::BF16, 0}, {DType::F32, 5}}) {
    const int64_t shard = packed + gap;
    std::vector<Floats> grads;
    std::vector<const void*> srcs;
    std::vector<DType> types;
    for (int p = 0; p < count; ++p) {
      grads.push_back(ramp(shapes[p].first * shapes[p].second, 0.01f, static_cast<float>(p)));
      types.push_back(p % 2 ? DType::F32 : DType::BF16);
      srcs.push_back(put(grads[p], types[p]));
    }
    void* rs_in = fresh(w * shard, rs_t);
    dev->reduce_scatter_copy_in(s, rs_in, rs_t, shard, w, slices.data(), srcs.data(), types.data(),
                                count);
    srcs.assign(count, nullptr);  // descriptors were copied at enqueue time
    const Floats got = get(rs_in, w * shard, rs_t);
    Floats expect(w * shard, 0.0f);
    for (int p = 0; p < count; ++p)
      for (int r = 0; r < w; ++r)
        for (int64_t j = 0; j < slices[p].rows_per_rank; ++j)
          for (int64_t c = 0; c < slices[p].cols; ++c) {
            const int64_t row = r * slices[p].rows_per_rank + j;
            if (row < slices[p].rows)
              expect[r * shard + slices[p].offset + j * slices[p].cols + c] =
                  round_to(rs_t, round_to(types[p], grads[p][row * slices[p].cols + c]));
          }
    ASSERT_EQ(got, expect);
    std::vector<void*> dsts;
    for (int p = 0; p < count; ++p) dsts.push_back(fresh(grads[p].size(), rs_t));
    dev->all_gather_copy_out(s, rs_in, rs_t, shard, w, slices.data(), dsts.data(), count);
    for (int p = 0; p < count; ++p) {
      Floats back = get(dsts[p], grads[p].size(), rs_t);
      for (size_t i = 0; i < back.size(); ++i)
        ASSERT_EQ(back[i], round_to(rs_t, round_to(types[p], grads[p][i]))) << p << " " << i;
    }
  }
}

TEST_F(CpuBackendKernels, AdamWAndSgdMatchTwoStepsByHand) {
  const Floats p0 = {0.5f, -1.0f, 2.0f, 0.0f}, g1 = {0.1f, -0.2f, 0.3f, 0.0f},
               g2 = {-0.05f, 0.4f, 0.0f, 0.0f};
  const AdamWConfig c{0.1f, 0.9f, 0.999f, 1e-8f, 0.01f};
  std::vector<double> p(p0.begin(), p0.end()), m(4, 0), v(4, 0);
  for (int t = 1; t <= 2; ++t) {
    const Floats& g = t == 1 ? g1 : g2;
    for (int i = 0; i < 4; ++i) {
      p[i] *= 1.0 - double(c.lr) * c.weight_decay;
      m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g[i];
      v[i] = c.beta2 * v[i] + (1.0 - double(c.beta2)) * g[i] * g[i];
      const double mhat = m[i] / (1.0 - std::pow(double(c.beta1), t));
      const double vhat = v[i] / (1.0 - std::pow(double(c.beta2), t));
      p[i] -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
    }
  }
  auto* param = static_cast<float*>(put(p0));
  auto* grad = static_cast<float*>(put(g1));
  auto* exp_avg = static_cast<float*>(put(Floats(4, 0)));
  auto* exp_avg_sq = static_cast<float*>(put(Floats(4, 0)));
  // Two tensors in one launch: the first three elements and the last one.
  OptimTensor ts[2] = {{param, grad, exp_avg, exp_avg_sq, 3},
                       {param + 3, grad + 3, exp_avg + 3, exp_avg_sq + 3, 1}};
  dev->adamw_step(s, ts, 2, c, 1);
  dev->copy_from_host(s, grad, g2.data(), 16);
  dev->adamw_step(s, ts, 2, c, 2);
  const Floats got = get(param, 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], p[i], 2e-6) << i;
  EXPECT_EQ(got[3], 0.0f);  // padding stays zero

  // SGD, momentum 0.9, weight decay 0.1: g' = g + wd p; buf = 0.9 buf + g'; p -= lr buf.
  std::vector<double> q(p0.begin(), p0.end()), buf(4, 0);
  for (const Floats* g : {&g1, &g2})
    for (int i = 0; i < 4; ++i) {
      buf[i] = 0.9 * buf[i] + ((*g)[i] + 0.1 * q[i]);
      q[i] -= 0.5 * buf[i];
    }
  auto* sp = static_cast<float*>(put(p0));
  auto* sg = static_cast<float*>(put(g1));
  OptimTensor st{sp, sg, static_cast<float*>(put(Floats(4, 0))), nullptr, 4};
  dev->sgd_step(s, &st, 1, 0.5f, 0.9f, 0.1f);
  dev->copy_from_host(s, sg, g2.data(), 16);
  dev->sgd_step(s, &st, 1, 0.5f, 0.9f, 0.1f);
  const Floats sgot = get(sp, 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(sgot[i], q[i], 1e-6) << i;
  OptimTensor plain{sp, sg, nullptr, nullptr, 4};  // no momentum: no state needed
  dev->sgd_step(s, &plain, 1, 1.0f, 0.0f, 0.0f);
  const Floats pgot = get(sp, 4);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(pgot[i], sgot[i] - g2[i]);
}

TEST_F(CpuBackendKernels, LossesMatchReferences) {
  for (DType t : {DType::F32, DType::BF16}) {
    const Floats y = ramp(11, 0.7f, 0.3f);
    auto* loss = static_cast<float*>(fresh(1));
    void* dy = fresh(11, t);
    dev->mean_square_loss(s, put(y, t), t, 11, loss, dy);
    double ref = 0;
    for (float v : y) ref += double(round_to(t, v)) * round_to(t, v);
    EXPECT_NEAR(get(loss, 1)[0], ref / 11, 1e-6);
    const Floats dgot = get(dy, 11, t);
    for (int i = 0; i < 11; ++i) EXPECT_EQ(dgot[i], round_to(t, 2.0f / 11 * round_to(t, y[i])));

    const int64_t rows = 3, classes = 5;
    const Floats logits = ramp(rows * classes, 1.3f, 0.1f);
    const std::vector<int32_t> labels = {4, 0, 2};
    auto* lab = static_cast<int32_t*>(fresh(rows));
    dev->copy_from_host(s, lab, labels.data(), rows * 4);
    void* dl = fresh(rows * classes, t);
    dev->cross_entropy_loss(s, put(logits, t), t, lab, rows, classes, loss, dl);
    const Floats dlgot = get(dl, rows * classes, t);
    double total = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double z = 0;
      for (int64_t c = 0; c < classes; ++c)
        z += std::exp(double(round_to(t, logits[r * classes + c])));
      total += std::log(z) - round_to(t, logits[r * classes + labels[r]]);
      for (int64_t c = 0; c < classes; ++c) {
        const double p = std::exp(double(round_to(t, logits[r * classes + c]))) / z;
        EXPECT_NEAR(dlgot[r * classes + c], (p - (c == labels[r])) / rows,
                    t == DType::F32 ? 1e-6 : 2e-3);
      }
    }
    EXPECT_NEAR(get(loss, 1)[0], total / rows, 1e-5);
  }
}

// A synthetic row's label is the first argmax of its first `width` features, as
// synthetic_batch makes them (in fp32, so no rounding hides a tie).
TEST_F(CpuBackendKernels, SyntheticLabelsAreTheArgmaxOfTheRowsFeatures) {
  const int64_t rows = 37, cols = 20, first_row = 5, step = 3;
  void* x = fresh(rows * cols);
  dev->synthetic_batch(s, x, DType::F32, rows, cols, 9, step, first_row, 1.5f);
  const Floats features = get(x, rows * cols);
  for (int64_t width : {1, 7, 16}) {
    auto* labels = static_cast<int32_t*>(fresh(rows));
    dev->synthetic_labels(s, labels, rows, width, 9, step, first_row, 1.5f);
    std::vector<int32_t> got(rows);
    dev->copy_to_host(s, got.data(), labels, rows * sizeof(int32_t));
    dev->synchronize();
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = features.data() + r * cols;
      EXPECT_EQ(got[r], std::max_element(row, row + width) - row) << "row " << r << " width " << width;
    }
  }
}

TEST_F(CpuBackendKernels, SoftmaxBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, cols = 6;
  const Floats x = ramp(rows * cols, 0.9f, 0.2f), wts = ramp(rows * cols, 2.1f, 1.0f);
  auto softmax_loss = [&](const std::vector<double>& xs) {  // L = sum w * softmax(x)
    double loss = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double z = 0;
      for (int64_t c = 0; c < cols; ++c) z += std::exp(xs[r * cols + c]);
      for (int64_t c = 0; c < cols; ++c) loss += wts[r * cols + c] * std::exp(xs[r * cols + c]) / z;
    }
    return loss;
  };
  auto* probs = static_cast<float*>(fresh(rows * cols));
  dev->softmax_rows(s, put(x), DType::F32, probs, rows, cols);
  void* dx = fresh(rows * cols);
  dev->softmax_rows_backward(s, probs, static_cast<float*>(put(wts)), dx, DType::F32, rows, cols);
  const Floats got = get(dx, rows * cols), p = get(probs, rows * cols);
  std::vector<double> xs(x.begin(), x.end());
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double h = 1e-5, keep = xs[i];
    xs[i] = keep + h;
    const double up = softmax_loss(xs);
    xs[i] = keep - h;
    const double down = softmax_loss(xs);
    xs[i] = keep;
    EXPECT_NEAR(got[i], (up - down) / (2 * h), 1e-5) << i;
  }
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += p[r * cols + c];
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

TEST_F(CpuBackendKernels, GemmAllTransposesAndDtypes) {
  const int64_t m = 5, n = 7, k = 33;
  const Floats a = ramp(m * k, 0.37f, 0.0f), b = ramp(k * n, 0.11f, 1.0f),
               c0 = ramp(m * n, 0.5f, 2.0f);
  for (auto [ab_t, c_t] :
       {std::pair{DType::F32, DType::F32}, {DType::BF16, DType::BF16}, {DType::BF16, DType::F32}})
    for (int trans = 0; trans < 4; ++trans)
      for (float beta : {0.0f, 0.25f}) {
        const bool ta = trans & 1, tb = trans & 2;
        void* c = beta == 0 ? fresh(m * n, c_t) : put(c0, c_t);  // beta 0 never reads NaN C
        dev->gemm(s, ta, tb, m, n, k, 0.5f, put(a, ab_t), put(b, ab_t), ab_t, beta, c, c_t);
        const Floats got = get(c, m * n, c_t);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double ref = 0;  // a and b are read through the stored layouts
            for (int64_t q = 0; q < k; ++q)
              ref += double(round_to(ab_t, a[ta ? q * m + i : i * k + q])) *
                     round_to(ab_t, b[tb ? j * k + q : q * n + j]);
            ref = 0.5 * ref + (beta == 0 ? 0.0 : beta * double(round_to(c_t, c0[i * n + j])));
            const double tol = c_t == DType::F32 ? 1e-4 : 1e-2 * std::max(1.0, std::abs(ref));
            ASSERT_NEAR(got[i * n + j], ref, tol) << ta << tb << " " << dtype_name(ab_t);
          }
      }
}

// Token ids (I32) have no float kernel: one taken as bf16 wrote half of each id's bytes.
TEST_F(CpuBackendKernels, AFloatKernelRefusesI32Data) {
  int32_t ids[4] = {7, 7, 7, 7};
  EXPECT_THROW(kernels::fill(ids, DType::I32, 4, 0.0f), fsdp::Error);
  EXPECT_EQ(ids[0], 7);
  EXPECT_EQ(ids[3], 7);
}

TEST_F(CpuBackendKernels, ElementwiseKernelsMatchReferences) {
  const int64_t n = 13;
  const Floats x = ramp(n, 0.8f, -0.4f), y = ramp(n, 0.3f, 0.9f);
  for (DType t : {DType::F32, DType::BF16}) {
    void *px = put(x, t), *py = put(y, t);
    void *out = fresh(n, t), *out2 = fresh(n, t);
    dev->activation_forward(s, Activation::ReLU, px, out, t, n);
    dev->activation_backward(s, Activation::ReLU, px, py, out2, t, n);
    Floats f = get(out, n, t), g = get(out2, n, t);
    for (int64_t i = 0; i < n; ++i) {
      const float xi = round_to(t, x[i]);
      EXPECT_EQ(f[i], xi > 0 ? xi : 0.0f);
      EXPECT_EQ(g[i], xi > 0 ? round_to(t, y[i]) : 0.0f);
    }
    dev->activation_forward(s, Activation::GELU, px, out, t, n);
    dev->activation_backward(s, Activation::GELU, px, py, out2, t, n);
    f = get(out, n, t);
    g = get(out2, n, t);
    const double tol = t == DType::F32 ? 1e-5 : 1e-2;
    for (int64_t i = 0; i < n; ++i) {
      const double xi = round_to(t, x[i]), h = 1e-4;
      auto gelu = [](double v) {
        return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
      };
      EXPECT_NEAR(f[i], gelu(xi), tol);
      EXPECT_NEAR(g[i], round_to(t, y[i]) * (gelu(xi + h) - gelu(xi - h)) / (2 * h), tol);
    }
    dev->add(s, out, px, py, t, n);
    f = get(out, n, t);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(f[i], round_to(t, round_to(t, x[i]) + round_to(t, y[i])));
    dev->fill(s, out, t, n, 1.1f);
    EXPECT_EQ(get(out, n, t), Floats(n, round_to(t, 1.1f)));
    // scale_rows: 3 rows of 4, weights every other float; then accumulate on top.
    const Floats w = {2.0f, 9.0f, -1.0f, 9.0f, 0.5f};
    void* so = fresh(12, t);
    dev->scale_rows(s, so, px, t, static_cast<float*>(put(w)), 2, 3, 4, false);
    dev->scale_rows(s, so, px, t, static_cast<float*>(put(w)), 2, 3, 4, true);
    f = get(so, 12, t);
    for (int64_t i = 0; i < 12; ++i) {
      const float once = round_to(t, w[(i / 4) * 2] * round_to(t, x[i]));
      EXPECT_EQ(f[i], round_to(t, once + w[(i / 4) * 2] * round_to(t, x[i])));
    }
    auto* dots = static_cast<float*>(put(Floats(6, -7.0f)));
    dev->row_dot(s, px, py, t, dots, 2, 3, 4);
    f = get(dots, 6);
    for (int64_t r = 0; r < 3; ++r) {
      float ref = 0;
      for (int64_t c = 0; c < 4; ++c) ref += round_to(t, x[r * 4 + c]) * round_to(t, y[r * 4 + c]);
      EXPECT_FLOAT_EQ(f[2 * r], ref);
      EXPECT_EQ(f[2 * r + 1], -7.0f);  // the stride skips it
    }
    auto* acc = static_cast<float*>(put(Floats(n, 1.0f)));
    dev->accumulate(s, acc, px, t, n, -0.5f);
    f = get(acc, n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(f[i], 1.0f - 0.5f * round_to(t, x[i]));
  }
  void* wide = put(x);
  void* narrow = fresh(n, DType::BF16);
  dev->cast(s, narrow, DType::BF16, wide, DType::F32, n);
  EXPECT_EQ(get(narrow, n, DType::BF16), get(put(x, DType::BF16), n, DType::BF16));
}

}  // namespace
}  // namespace fsdp::cpu
