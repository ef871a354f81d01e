// The fused residual + RMSNorm ops on the CPU backend (the reference the CUDA kernels are checked
// against): add_rms_norm_forward is exactly add() then rms_norm_forward, in fp32 and bf16, also
// with h written over one of its inputs; rms_norm_backward_add is rms_norm_backward plus the
// residual gradient (exactly in fp32, where nothing rounds in between) and matches finite
// differences of the fused forward; and the fused ops give one-line errors for null buffers.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"
#include "fsdp/error.h"

namespace fsdp::cpu {
namespace {

using cpu_test::download;
using cpu_test::Floats;
using cpu_test::round_to;
using cpu_test::upload;

using cpu_test::values;

class FusedNormOps : public cpu_test::DeviceTest {};

constexpr int64_t kRows = 5, kCols = 12;
constexpr float kEps = 1e-5f;

TEST_F(FusedNormOps, AddRmsNormForwardIsAddThenNormExactly) {
  const Floats x = values(kRows * kCols, 1.5f, 1), res = values(kRows * kCols, 0.7f, 2);
  const Floats w = values(kCols, 1.0f, 3);
  for (DType t : {DType::F32, DType::BF16}) {
    for (bool in_place : {false, true}) {
      const int64_t n = kRows * kCols;
      void* hs = fresh(n, t);
      void* ys = fresh(n, t);
      auto* rstd_s = static_cast<float*>(fresh(kRows));
      void *xd = put(x, t), *rd = put(res, t), *wd = put(w, t);
      dev->add(s, hs, xd, rd, t, n);
      dev->rms_norm_forward(s, hs, wd, t, kRows, kCols, kEps, ys, rstd_s, nullptr);
      void* hf = in_place ? xd : fresh(n, t);  // h may overwrite x
      void* yf = fresh(n, t);
      auto* rstd_f = static_cast<float*>(fresh(kRows));
      dev->add_rms_norm_forward(s, xd, rd, wd, t, kRows, kCols, kEps, hf, yf, rstd_f, nullptr);
      const std::string what = std::string(dtype_name(t)) + (in_place ? " in place" : "");
      EXPECT_EQ(get(hf, n, t), get(hs, n, t)) << what;
      EXPECT_EQ(get(yf, n, t), get(ys, n, t)) << what;
      EXPECT_EQ(get(rstd_f, kRows), get(rstd_s, kRows)) << what;
    }
  }
}

TEST_F(FusedNormOps, RmsNormBackwardAddIsBackwardPlusResidualGradient) {
  const int64_t n = kRows * kCols;
  // Inputs exact in bf16, so the fp32 run sees the very values the bf16 run does.
  auto bf16_exact = [](Floats v) {
    for (float& x : v) x = round_to(DType::BF16, x);
    return v;
  };
  const Floats x = bf16_exact(values(n, 1.5f, 4)), w = bf16_exact(values(kCols, 1.0f, 5));
  const Floats dy = bf16_exact(values(n, 1.0f, 6)), dres = bf16_exact(values(n, 0.5f, 7));
  Floats fp32_dx, fp32_dw;
  for (DType t : {DType::F32, DType::BF16}) {
    void *xd = put(x, t), *wd = put(w, t), *dyd = put(dy, t), *dresd = put(dres, t);
    auto* rstd = static_cast<float*>(fresh(kRows));
    dev->rms_norm_forward(s, xd, wd, t, kRows, kCols, kEps, fresh(n, t), rstd, nullptr);
    void* dx = fresh(n, t);
    void* dw = fresh(kCols, t);
    dev->rms_norm_backward_add(s, xd, wd, rstd, dyd, dresd, t, kRows, kCols, dx, dw, nullptr);
    const Floats got = get(dx, n, t), got_dw = get(dw, kCols, t);
    if (t == DType::F32) {
      // fp32 stores are exact, so the unfused pair rounds once too: the same values.
      void* dx_plain = fresh(n);
      void* dw_plain = fresh(kCols);
      dev->rms_norm_backward(s, xd, wd, rstd, dyd, t, kRows, kCols, dx_plain, dw_plain, nullptr);
      void* dx_sum = fresh(n);
      dev->add(s, dx_sum, dx_plain, dresd, t, n);
      EXPECT_EQ(got, get(dx_sum, n));
      EXPECT_EQ(got_dw, get(dw_plain, kCols));
      fp32_dx = got, fp32_dw = got_dw;
    } else {
      // bf16 is the fp32 result rounded once (the unfused pair would round twice).
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], round_to(t, fp32_dx[i])) << i;
      for (int64_t c = 0; c < kCols; ++c) EXPECT_EQ(got_dw[c], round_to(t, fp32_dw[c])) << c;
    }
    // dx may overwrite the residual gradient.
    dev->rms_norm_backward_add(s, xd, wd, rstd, dyd, dresd, t, kRows, kCols, dresd,
                               fresh(kCols, t), nullptr);
    EXPECT_EQ(get(dresd, n, t), got) << dtype_name(t);
  }
}

// L = sum(r_y * y) + sum(r_h * h) for (h, y) = fused forward of (x, res): dL/dx = dL/dres =
// r_h + norm's backward of r_y, which rms_norm_backward_add gives with dresidual = r_h.
TEST_F(FusedNormOps, FusedBackwardMatchesFiniteDifferencesOfTheFusedForward) {
  const int64_t n = kRows * kCols;
  const Floats x = values(n, 1.0f, 8), res = values(n, 0.6f, 9), w = values(kCols, 1.0f, 10);
  const Floats ry = values(n, 1.0f, 11), rh = values(n, 0.8f, 12);
  auto loss_at = [&](const Floats& xv) {
    void* h = fresh(n);
    void* y = fresh(n);
    dev->add_rms_norm_forward(s, put(xv), put(res), put(w), DType::F32, kRows, kCols, kEps, h, y,
                              static_cast<float*>(fresh(kRows)), nullptr);
    const Floats hv = get(h, n), yv = get(y, n);
    double l = 0;
    for (int64_t i = 0; i < n; ++i) l += double{ry[i]} * yv[i] + double{rh[i]} * hv[i];
    return l;
  };
  void* h = fresh(n);
  auto* rstd = static_cast<float*>(fresh(kRows));
  void* wd = put(w);
  dev->add_rms_norm_forward(s, put(x), put(res), wd, DType::F32, kRows, kCols, kEps, h, fresh(n),
                            rstd, nullptr);
  void* dx = fresh(n);
  dev->rms_norm_backward_add(s, h, wd, rstd, put(ry), put(rh), DType::F32, kRows, kCols, dx,
                             fresh(kCols), nullptr);
  const Floats got = get(dx, n);
  Floats xv = x;
  const float step = 1e-2f;
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    xv[i] = x[i] + step;
    const double up = loss_at(xv);
    xv[i] = x[i] - step;
    const double down = loss_at(xv);
    xv[i] = x[i];
    const double numeric = (up - down) / (2.0 * step);
    err += (got[i] - numeric) * (got[i] - numeric);
    norm += numeric * numeric;
  }
  EXPECT_LE(std::sqrt(err / norm), 2e-3);
}

TEST_F(FusedNormOps, NullBuffersGiveOneLineErrors) {
  const int64_t n = kRows * kCols;
  void *x = fresh(n), *w = fresh(kCols), *out = fresh(n);
  auto* rstd = static_cast<float*>(fresh(kRows));
  auto error_of = [&](const std::function<void()>& call) -> std::string {
    try {
      call();
      dev->synchronize();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string fwd = error_of([&] {
    dev->add_rms_norm_forward(s, x, nullptr, w, DType::F32, kRows, kCols, kEps, out, out, rstd, nullptr);
  });
  EXPECT_NE(fwd.find("add_rms_norm_forward"), std::string::npos) << fwd;
  EXPECT_NE(fwd.find("residual"), std::string::npos) << fwd;
  EXPECT_EQ(fwd.find('\n'), std::string::npos) << fwd;
  const std::string bwd = error_of([&] {
    dev->rms_norm_backward_add(s, x, w, rstd, x, nullptr, DType::F32, kRows, kCols, out, w, nullptr);
  });
  EXPECT_NE(bwd.find("rms_norm_backward_add"), std::string::npos) << bwd;
  EXPECT_NE(bwd.find("dresidual"), std::string::npos) << bwd;
  EXPECT_EQ(bwd.find('\n'), std::string::npos) << bwd;
}

}  // namespace
}  // namespace fsdp::cpu
