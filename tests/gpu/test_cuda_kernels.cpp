// GPU tests of the CUDA backend's compute ops: every CudaDevice kernel against a plain host
// reference on fresh random data (never zeros; outputs poisoned with NaN first): gemm, fill and
// cast, the all-gather copy-out and reduce-scatter copy-in, optimizers, activations, softmax,
// row ops, losses and the synthetic batch. The fixture is in cuda_test_util.h; main() is in
// test_cuda_backend.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "fsdp/synthetic.h"

namespace fsdp {
namespace {

using cuda_test::CudaBackendTest;
using cuda_test::expect_close;
using cuda_test::kTypes;
using cuda_test::round_to;
using cuda_test::to_double;

TEST_F(CudaBackendTest, GemmMatchesHostForEveryTransposeAndType) {
  const int64_t m = 37, n = 61, k = 83;
  for (DType ab_t : kTypes) {
    for (DType c_t : kTypes) {
      if (ab_t == DType::F32 && c_t == DType::BF16) continue;  // not a combination the engine uses
      for (int trans = 0; trans < 4; ++trans) {
        for (float beta : {0.0f, 0.5f}) {
          const bool ta = trans & 1, tb = trans & 2;
          const auto a = rounded(ab_t, random(m * k)), b = rounded(ab_t, random(k * n));
          const auto c0 = rounded(c_t, random(m * n));
          void* da = upload(ab_t, a);
          void* db = upload(ab_t, b);
          void* dc = beta == 0.0f ? poisoned(c_t, m * n) : upload(c_t, c0);
          device->gemm(s, ta, tb, m, n, k, 1.5f, da, db, ab_t, beta, dc, c_t);
          const auto got = read(dc, c_t, m * n);
          double err = 0, norm = 0;
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double sum = 0;
              for (int64_t p = 0; p < k; ++p)
                sum +=
                    double{ta ? a[p * m + i] : a[i * k + p]} * (tb ? b[j * k + p] : b[p * n + j]);
              const double want = 1.5 * sum + (beta == 0.0f ? 0.0 : beta * double{c0[i * n + j]});
              err += (got[i * n + j] - want) * (got[i * n + j] - want);
              norm += want * want;
            }
          const double limit = ab_t == DType::F32 && c_t == DType::F32 ? 1e-5 : 1e-2;
          EXPECT_LT(std::sqrt(err / norm), limit)
              << dtype_name(ab_t) << "->" << dtype_name(c_t) << " ta=" << ta << " tb=" << tb
              << " beta=" << beta;
        }
      }
    }
  }
  void* dc = upload(DType::F32, random(6));  // k == 0: C = beta C
  device->gemm(s, false, false, 2, 3, 0, 1.0f, nullptr, nullptr, DType::F32, 0.0f, dc, DType::F32);
  EXPECT_EQ(read(dc, DType::F32, 6), std::vector<float>(6, 0.0f));
}

TEST_F(CudaBackendTest, FillCastAndCopies) {
  const int64_t n = 1001;  // odd: the scalar tail runs; +1 offsets: the unaligned path runs
  for (DType t : kTypes) {
    void* p = buffer(t, n + 1);
    void* unaligned = static_cast<char*>(p) + dtype_size(t);
    device->fill(s, unaligned, t, n, 3.25f);
    EXPECT_EQ(read(unaligned, t, n), std::vector<float>(n, 3.25f));
  }
  const auto x = random(n, 0.1f, 100.0f);
  void* f = upload(DType::F32, x);
  void* h = poisoned(DType::BF16, n);
  device->cast(s, h, DType::BF16, f, DType::F32, n);
  EXPECT_EQ(read(h, DType::BF16, n), rounded(DType::BF16, x));
  void* back = poisoned(DType::F32, n);
  device->cast(s, back, DType::F32, h, DType::BF16, n);
  EXPECT_EQ(read(back, DType::F32, n), rounded(DType::BF16, x));
  void* copy = poisoned(DType::F32, n);
  device->copy(s, copy, f, n * 4);
  EXPECT_EQ(read(copy, DType::F32, n), x);
}

struct Shape {
  int64_t rows, cols;
};
// Params one after another in the flat shard, offsets rounded up to `align` elements.
std::vector<ShardSlice> lay_out(const std::vector<Shape>& shapes, int world, int64_t align,
                                int64_t* shard_numel) {
  std::vector<ShardSlice> slices;
  int64_t offset = 0;
  for (const Shape& sh : shapes) {
    const int64_t per_rank = (sh.rows + world - 1) / world;
    slices.push_back({sh.rows, sh.cols, per_rank, offset});
    offset = (offset + per_rank * sh.cols + align - 1) / align * align;
  }
  *shard_numel = offset + align;  // a tail no param covers
  return slices;
}

std::vector<std::vector<Shape>> shard_cases() {
  std::vector<Shape> many(70, Shape{3, 5});  // more params than fit in kernel parameters
  return {{{17, 257}, {5, 1}, {3, 7}, {1, 33}}, {{64, 64}, {24, 8}, {17, 16}}, many};
}

TEST_F(CudaBackendTest, AllGatherCopyOutMatchesShardLayout) {
  const int world = 3;
  for (DType t : kTypes) {
    for (const auto& shapes : shard_cases()) {
      int64_t shard_numel = 0;
      const auto slices = lay_out(shapes, world, shapes.size() == 3 ? 8 : 1, &shard_numel);
      const auto gathered = rounded(t, random(world * shard_numel));
      void* dg = upload(t, gathered);
      std::vector<void*> dsts;
      for (const auto& sl : slices) dsts.push_back(poisoned(t, sl.rows * sl.cols));
      device->all_gather_copy_out(s, dg, t, shard_numel, world, slices.data(), dsts.data(),
                                  static_cast<int>(slices.size()));
      for (size_t p = 0; p < slices.size(); ++p) {
        const ShardSlice& sl = slices[p];
        std::vector<float> want(sl.rows * sl.cols);
        for (int64_t i = 0; i < sl.rows; ++i)
          for (int64_t c = 0; c < sl.cols; ++c) {
            const int64_t r = i / sl.rows_per_rank;
            want[i * sl.cols + c] =
                gathered[r * shard_numel + sl.offset + (i - r * sl.rows_per_rank) * sl.cols + c];
          }
        ASSERT_EQ(read(dsts[p], t, sl.rows * sl.cols), want) << dtype_name(t) << " param " << p;
      }
    }
  }
}

TEST_F(CudaBackendTest, ReduceScatterCopyInPadsInterleavesAndCasts) {
  const int world = 3;
  for (DType rs_t : kTypes) {
    for (const auto& shapes : shard_cases()) {
      int64_t shard_numel = 0;
      const auto slices = lay_out(shapes, world, shapes.size() == 3 ? 8 : 1, &shard_numel);
      std::vector<std::vector<float>> grads;
      std::vector<const void*> srcs;
      std::vector<DType> types;
      for (size_t p = 0; p < slices.size(); ++p) {
        types.push_back(kTypes[p % 2]);
        grads.push_back(rounded(types[p], random(slices[p].rows * slices[p].cols)));
        srcs.push_back(upload(types[p], grads[p]));
      }
      void* rs_in = poisoned(rs_t, world * shard_numel);
      device->reduce_scatter_copy_in(s, rs_in, rs_t, shard_numel, world, slices.data(), srcs.data(),
                                     types.data(), static_cast<int>(slices.size()));
      const auto got = read(rs_in, rs_t, world * shard_numel);
      for (size_t p = 0; p < slices.size(); ++p) {
        const ShardSlice& sl = slices[p];
        for (int r = 0; r < world; ++r)
          for (int64_t j = 0; j < sl.rows_per_rank; ++j)
            for (int64_t c = 0; c < sl.cols; ++c) {
              const int64_t row = r * sl.rows_per_rank + j;
              const float want = row < sl.rows ? round_to(rs_t, grads[p][row * sl.cols + c]) : 0.0f;
              const float g = got[r * shard_numel + sl.offset + j * sl.cols + c];
              ASSERT_EQ(g, want) << dtype_name(rs_t) << " param " << p << " rank " << r << " row "
                                 << j << " col " << c;
            }
      }
    }
  }
}

TEST_F(CudaBackendTest, AccumulateAddsScaledSource) {
  const int64_t n = 1003;
  for (DType t : kTypes) {
    const auto dst = random(n), src = rounded(t, random(n));
    void* d = upload(DType::F32, dst);
    device->accumulate(s, static_cast<float*>(d), upload(t, src), t, n, 0.37f);
    std::vector<double> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = dst[i] + 0.37 * src[i];
    expect_close(read(d, DType::F32, n), want, 1e-6, 1e-7, "accumulate");
  }
}

struct HostState {
  std::vector<float> p, g, m, v;
};

TEST_F(CudaBackendTest, AdamWMatchesDoubleReference) {
  const AdamWConfig c{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f};
  std::vector<HostState> host;
  std::vector<OptimTensor> tensors;
  for (int64_t numel : {1000, 17, 4099}) {
    HostState h{random(numel), random(numel), random(numel, 0.01f, 0.1f),
                random(numel, 0.001f, 0.01f, false)};
    tensors.push_back({static_cast<float*>(upload(DType::F32, h.p)),
                       static_cast<const float*>(upload(DType::F32, h.g)),
                       static_cast<float*>(upload(DType::F32, h.m)),
                       static_cast<float*>(upload(DType::F32, h.v)), numel});
    host.push_back(std::move(h));
  }
  std::vector<std::vector<double>> p(3), m(3), v(3);
  for (int i = 0; i < 3; ++i)
    p[i] = to_double(host[i].p), m[i] = to_double(host[i].m), v[i] = to_double(host[i].v);
  for (int64_t step = 1; step <= 3; ++step) {
    device->adamw_step(s, tensors.data(), 3, c, step);
    const double bc1 = 1 - std::pow(double{c.beta1}, step),
                 bc2 = 1 - std::pow(double{c.beta2}, step);
    for (int i = 0; i < 3; ++i)
      for (size_t e = 0; e < p[i].size(); ++e) {
        const double g = host[i].g[e];
        p[i][e] *= 1 - double{c.lr} * c.weight_decay;
        m[i][e] = c.beta1 * m[i][e] + (1 - double{c.beta1}) * g;
        v[i][e] = c.beta2 * v[i][e] + (1 - double{c.beta2}) * g * g;
        p[i][e] -= c.lr / bc1 * m[i][e] / (std::sqrt(v[i][e]) / std::sqrt(bc2) + c.eps);
      }
  }
  for (int i = 0; i < 3; ++i) {
    expect_close(read(tensors[i].param, DType::F32, tensors[i].numel), p[i], 1e-5, 1e-6, "param");
    expect_close(read(tensors[i].state0, DType::F32, tensors[i].numel), m[i], 1e-5, 1e-7,
                 "exp_avg");
    expect_close(read(tensors[i].state1, DType::F32, tensors[i].numel), v[i], 1e-5, 1e-9,
                 "exp_avg_sq");
  }
}

TEST_F(CudaBackendTest, SgdWithAndWithoutMomentumOverManyTensors) {
  for (float momentum : {0.9f, 0.0f}) {
    const int count = 70, numel = 33;  // more tensors than fit in kernel parameters
    std::vector<OptimTensor> tensors;
    std::vector<std::vector<float>> p0, g;
    for (int i = 0; i < count; ++i) {
      p0.push_back(random(numel));
      g.push_back(random(numel));
      float* buf = nullptr;
      if (momentum != 0.0f) {
        buf = static_cast<float*>(buffer(DType::F32, numel));
        device->fill(s, buf, DType::F32, numel, 0.0f);  // the engine's zero-initialized buffer
      }
      tensors.push_back({static_cast<float*>(upload(DType::F32, p0[i])),
                         static_cast<const float*>(upload(DType::F32, g[i])), buf, nullptr, numel});
    }
    for (int step = 0; step < 2; ++step)
      device->sgd_step(s, tensors.data(), count, 0.1f, momentum, 0.01f);
    for (int i = 0; i < count; ++i) {
      std::vector<double> p = to_double(p0[i]), buf(numel, 0.0);
      for (int step = 0; step < 2; ++step)
        for (int e = 0; e < numel; ++e) {
          const double grad = g[i][e] + 0.01 * p[e];
          buf[e] = momentum * buf[e] + grad;
          p[e] -= 0.1 * (momentum != 0.0f ? buf[e] : grad);
        }
      expect_close(read(tensors[i].param, DType::F32, numel), p, 1e-5, 1e-6, "sgd param");
    }
  }
}

TEST_F(CudaBackendTest, ActivationsAndAdd) {
  const int64_t n = 2053;
  const double k = std::sqrt(2.0 / 3.14159265358979323846), cubic = 0.044715;
  for (DType t : kTypes) {
    const double rel = t == DType::F32 ? 1e-5 : 1e-2, abs = t == DType::F32 ? 1e-6 : 1e-3;
    const auto x = rounded(t, random(n, 0.05f, 3.0f)), dy = rounded(t, random(n));
    for (Activation f : {Activation::ReLU, Activation::GELU}) {
      void* y = poisoned(t, n);
      void* dx = poisoned(t, n);
      void* dx_in = upload(t, x);
      device->activation_forward(s, f, dx_in, y, t, n);
      device->activation_backward(s, f, dx_in, upload(t, dy), dx, t, n);
      std::vector<double> want_y(n), want_dx(n);
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[i], th = std::tanh(k * (v + cubic * v * v * v));
        want_y[i] = f == Activation::ReLU ? std::max(v, 0.0) : 0.5 * v * (1 + th);
        const double slope = f == Activation::ReLU ? (v > 0 ? 1.0 : 0.0)
                                                   : 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * k *
                                                                          (1 + 3 * cubic * v * v);
        want_dx[i] = slope * dy[i];
      }
      expect_close(read(y, t, n), want_y, rel, abs, "activation forward");
      expect_close(read(dx, t, n), want_dx, rel, abs, "activation backward");
    }
    const auto a = rounded(t, random(n)), b = rounded(t, random(n));
    void* out = poisoned(t, n);
    device->add(s, out, upload(t, a), upload(t, b), t, n);
    std::vector<double> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = double{a[i]} + b[i];
    expect_close(read(out, t, n), want, rel, abs, "add");
  }
}

TEST_F(CudaBackendTest, SoftmaxRowsAndBackward) {
  const int64_t rows = 19, cols = 300;
  for (DType t : kTypes) {
    const auto x = rounded(t, random(rows * cols, 0.1f, 4.0f)), dp = random(rows * cols);
    auto* probs = static_cast<float*>(poisoned(DType::F32, rows * cols));
    void* dx = poisoned(t, rows * cols);
    device->softmax_rows(s, upload(t, x), t, probs, rows, cols);
    device->softmax_rows_backward(s, probs, static_cast<const float*>(upload(DType::F32, dp)), dx,
                                  t, rows, cols);
    std::vector<double> want_p(rows * cols), want_dx(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      double mx = -1e30, sum = 0, dot = 0;
      for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, double{x[r * cols + c]});
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(x[r * cols + c] - mx);
      for (int64_t c = 0; c < cols; ++c)
        want_p[r * cols + c] = std::exp(x[r * cols + c] - mx) / sum;
      for (int64_t c = 0; c < cols; ++c) dot += want_p[r * cols + c] * dp[r * cols + c];
      for (int64_t c = 0; c < cols; ++c)
        want_dx[r * cols + c] = want_p[r * cols + c] * (dp[r * cols + c] - dot);
    }
    expect_close(read(probs, DType::F32, rows * cols), want_p, 1e-5, 1e-8, "softmax");
    expect_close(read(dx, t, rows * cols), want_dx, t == DType::F32 ? 1e-4 : 1e-2, 1e-7,
                 "softmax backward");
  }
}

TEST_F(CudaBackendTest, ScaleRowsAndRowDot) {
  const int64_t rows = 23, cols = 129, stride = 2;
  for (DType t : kTypes) {
    const auto in = rounded(t, random(rows * cols)), base = rounded(t, random(rows * cols));
    const auto w = random(rows * stride), b = rounded(t, random(rows * cols));
    const auto* dw = static_cast<const float*>(upload(DType::F32, w));
    for (bool acc : {false, true}) {
      void* out = acc ? upload(t, base) : poisoned(t, rows * cols);
      device->scale_rows(s, out, upload(t, in), t, dw, stride, rows, cols, acc);
      std::vector<double> want(rows * cols);
      for (int64_t i = 0; i < rows * cols; ++i)
        want[i] = (acc ? base[i] : 0.0) + double{w[(i / cols) * stride]} * in[i];
      expect_close(read(out, t, rows * cols), want, t == DType::F32 ? 1e-6 : 1e-2, 1e-6,
                   "scale_rows");
    }
    auto* dots = static_cast<float*>(upload(DType::F32, std::vector<float>(rows * stride, -5.0f)));
    device->row_dot(s, upload(t, in), upload(t, b), t, dots, stride, rows, cols);
    std::vector<double> want(rows * stride, -5.0);
    for (int64_t r = 0; r < rows; ++r) {
      want[r * stride] = 0;
      for (int64_t c = 0; c < cols; ++c)
        want[r * stride] += double{in[r * cols + c]} * b[r * cols + c];
    }
    expect_close(read(dots, DType::F32, rows * stride), want, 1e-5, 1e-5, "row_dot");
  }
}

TEST_F(CudaBackendTest, MeanSquareAndCrossEntropyLosses) {
  for (DType t : kTypes) {
    const double rel = t == DType::F32 ? 1e-5 : 1e-2;
    const int64_t n = 123457;
    const auto y = rounded(t, random(n));
    auto* loss = static_cast<float*>(poisoned(DType::F32, 1));
    void* dy = poisoned(t, n);
    device->mean_square_loss(s, upload(t, y), t, n, loss, dy);
    double sum = 0;
    std::vector<double> want_dy(n);
    for (int64_t i = 0; i < n; ++i) sum += double{y[i]} * y[i], want_dy[i] = 2.0 * y[i] / n;
    expect_close(read(loss, DType::F32, 1), {sum / n}, 1e-5, 0, "mean square loss");
    expect_close(read(dy, t, n), want_dy, rel, 1e-12, "mean square dy");

    const int64_t rows = 37, classes = 1001;
    const auto logits = rounded(t, random(rows * classes, 0.1f, 5.0f));
    std::vector<int32_t> labels(rows);
    for (auto& l : labels) l = static_cast<int32_t>(rng() % classes);
    auto* dlabels = static_cast<int32_t*>(buffer(DType::F32, rows));
    device->copy_from_host(s, dlabels, labels.data(), rows * sizeof(int32_t));
    void* dlogits = poisoned(t, rows * classes);
    device->cross_entropy_loss(s, upload(t, logits), t, dlabels, rows, classes, loss, dlogits);
    double total = 0;
    std::vector<double> want(rows * classes);
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = &logits[r * classes];
      double mx = -1e30, se = 0;
      for (int64_t c = 0; c < classes; ++c) mx = std::max(mx, double{x[c]});
      for (int64_t c = 0; c < classes; ++c) se += std::exp(x[c] - mx);
      total += mx + std::log(se) - x[labels[r]];
      for (int64_t c = 0; c < classes; ++c)
        want[r * classes + c] = (std::exp(x[c] - mx) / se - (c == labels[r])) / rows;
    }
    expect_close(read(loss, DType::F32, 1), {total / rows}, 1e-5, 0, "cross-entropy loss");
    expect_close(read(dlogits, t, rows * classes), want, rel, 1e-7, "dlogits");
  }
}

TEST_F(CudaBackendTest, SyntheticBatchIsBitIdenticalToTheHost) {
  const int64_t rows = 7, cols = 129, first_row = 5, step = 3;
  for (DType t : kTypes) {
    void* d = poisoned(t, rows * cols);
    device->synthetic_batch(s, d, t, rows, cols, 42, step, first_row, 0.5f);
    std::vector<float> want(rows * cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        want[r * cols + c] =
            round_to(t, synthetic_uniform(synthetic_row_seed(42, step, first_row + r), c, 0.5f));
    EXPECT_EQ(read(d, t, rows * cols), want) << dtype_name(t);
  }
}

TEST_F(CudaBackendTest, SyntheticLabelsAreBitIdenticalToTheHost) {
  const int64_t rows = 1000, first_row = 5, step = 3;
  auto* labels = static_cast<int32_t*>(device->alloc(rows * sizeof(int32_t), s, MemTag::Other));
  for (int64_t width : {1, 16, 129}) {
    device->synthetic_labels(s, labels, rows, width, 42, step, first_row, 0.5f);
    std::vector<int32_t> got(rows), want(rows);
    device->copy_to_host(s, got.data(), labels, rows * sizeof(int32_t));
    device->synchronize();
    for (int64_t r = 0; r < rows; ++r)
      want[r] = synthetic_label(synthetic_row_seed(42, step, first_row + r), width, 0.5f);
    EXPECT_EQ(got, want) << "width " << width;
  }
  device->free(labels, s);
}

}  // namespace
}  // namespace fsdp
