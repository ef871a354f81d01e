#include "fsdp/nn/layers.h"

#include <cmath>
#include <utility>

#include "fsdp/error.h"
#include "fsdp/nn/transformer.h"
#include "fsdp/synthetic.h"
#include "nn/fp8_linear.h"
#include "nn/host_chunks.h"

namespace fsdp::nn {

namespace {

Tensor new_act(RunContext& ctx, int64_t rows, int64_t cols, DType t = DType::F32, bool use_ctx = true) {
  return empty_tensor(*ctx.device, ctx.compute, use_ctx ? ctx.act_dtype : t, rows, cols,
                      MemTag::Activation);
}

Tensor ones(RunContext& ctx, int64_t n) {
  Tensor t = new_act(ctx, 1, n);
  ctx.device->fill(ctx.compute, t.data, t.dtype, n, 1.0f);
  return t;
}

}  // namespace

std::vector<float> uniform_init(uint64_t seed, int64_t n, float bound) {
  std::vector<float> v(static_cast<size_t>(n));
  for_each_host_chunk(n, int64_t{1} << 18, [&](int64_t first, int64_t last) {
    for (int64_t j = first; j < last; ++j)
      v[static_cast<size_t>(j)] = synthetic_uniform(seed, static_cast<uint64_t>(j), bound);
  });
  return v;
}

ParamInit uniform_init_fn(uint64_t seed, int64_t n, float bound) {
  return [=] { return uniform_init(seed, n, bound); };
}

ParamInit zeros_init_fn(int64_t n) {
  return [n] { return std::vector<float>(static_cast<size_t>(n), 0.0f); };
}

// ---- Linear
Linear::Linear(int64_t in, int64_t out, bool bias, uint64_t seed)
    : Module("Linear"), in_(in), out_(out) {
  FSDP_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  add_param("weight", {out, in}, uniform_init_fn(seed, out * in, bound));
  if (bias) add_param("bias", {out}, uniform_init_fn(seed ^ 0xb1a5ull, out, bound));
}

Linear::Linear(int64_t in, int64_t out, std::vector<float> weight_init)
    : Module("Linear"), in_(in), out_(out) {
  FSDP_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
  add_param("weight", {out, in}, std::move(weight_init));
}

Linear::Linear(int64_t in, int64_t out, ParamInit weight_init)
    : Module("Linear"), in_(in), out_(out) {
  FSDP_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
  add_param("weight", {out, in}, std::move(weight_init));
}

Linear::Linear(int64_t in, int64_t out, ParamInit weight_init, ParamInit bias_init)
    : Module("Linear"), in_(in), out_(out) {
  FSDP_CHECK(in > 0 && out > 0, "Linear(", in, ", ", out, "): sizes must be positive");
  add_param("weight", {out, in}, std::move(weight_init));
  add_param("bias", {out}, std::move(bias_init));
}

Tensor Linear::forward_impl(RunContext& ctx, const Tensor& x) {
  FSDP_CHECK(x.cols == in_, "Linear ", fqn(), " expects ", in_, " features, got ", x.cols);
  Device& d = *ctx.device;
  Tensor y = new_act(ctx, x.rows, out_);
  if (fused_relu) {
    FSDP_CHECK(!bias(), "Linear ", fqn(), ": fused_relu needs a Linear without bias");
    FSDP_CHECK(weight().fp8 == Fp8Recipe::None, "Linear ", fqn(), ": fused_relu has no fp8 GEMM");
    d.set_label(op_label("fwd", "gemm+relu"));
    d.gemm_relu(ctx.compute, false, true, x.rows, out_, in_, x.data, weight().value.data,
                ctx.act_dtype, y.data, y.dtype);
    saved_x_ = x;
    saved_y_ = y;
    return y;
  }
  bool x_as_codes = false;
  if (weight().fp8 != Fp8Recipe::None) {
    d.set_label(op_label("fwd", "fp8 gemm"));
    fp8_x_scales_ = fp8_linear_forward(ctx, fp8_weight(weight()), x, y, /*keep_x_codes=*/true);
    x_as_codes = fp8_x_scales_ && fp8_x_scales_->data_t;
  } else {
    d.set_label(op_label("fwd", "gemm"));
    d.gemm(ctx.compute, false, true, x.rows, out_, in_, 1.0f, x.data, weight().value.data,
           ctx.act_dtype, 0.0f, y.data, y.dtype);
  }
  if (Param* b = bias()) {
    Tensor one = ones(ctx, x.rows);
    d.gemm(ctx.compute, false, false, x.rows, out_, 1, 1.0f, one.data, b->value.data,
           ctx.act_dtype, 1.0f, y.data, y.dtype);
  }
  // Note [Fp8 operands reused by the weight grad]: X^T's codes stand for X.
  saved_x_ = x_as_codes ? Tensor{} : x;
  return y;
}

bool Linear::has_saved_input() const {
  return saved_x_.defined() || (fp8_x_scales_ && fp8_x_scales_->data_t);
}

void Linear::recompute_impl(RunContext& ctx, const Tensor& x) {
  if (fused_relu) {
    (void)forward_impl(ctx, x);
    return;
  }
  FSDP_CHECK(x.cols == in_, "Linear ", fqn(), " expects ", in_, " features, got ", x.cols);
  saved_x_ = x;
  // fp8: no forward scales to reuse, so the weight grad takes X's amax itself (X's fused one
  // where its producer took it: Note [Fused amax]), the same value, so the same codes.
  fp8_x_scales_.reset();
}

void Linear::weight_grads(RunContext& ctx, const Tensor& x, const Tensor& dy,
                          const Fp8Operand* fp8_x, const Fp8Operand* fp8_dy) {
  Device& d = *ctx.device;
  Tensor dw = empty_tensor(d, ctx.compute, ctx.act_dtype, out_, in_, MemTag::Grad);
  if (weight().fp8 != Fp8Recipe::None) {
    d.set_label(op_label("bwd", "fp8 gemm dW"));
    fp8_linear_weight_grad(ctx, fp8_weight(weight()), x, dy, dw, fp8_x, fp8_dy);
  } else {
    d.set_label(op_label("bwd", "gemm dW"));
    d.gemm(ctx.compute, true, false, out_, in_, x.rows, 1.0f, dy.data, x.data, ctx.act_dtype,
           0.0f, dw.data, dw.dtype);
  }
  if (Param* b = bias()) {
    Tensor db = empty_tensor(d, ctx.compute, ctx.act_dtype, 1, out_, MemTag::Grad);
    Tensor one = ones(ctx, dy.rows);
    d.gemm(ctx.compute, false, false, 1, out_, dy.rows, 1.0f, one.data, dy.data, ctx.act_dtype,
           0.0f, db.data, db.dtype);
    weight().set_grad(ctx, std::move(dw));
    b->set_grad(ctx, std::move(db));
  } else {
    weight().set_grad(ctx, std::move(dw));
  }
}

Tensor Linear::backward_impl(RunContext& ctx, const Tensor& dy_out, bool input_grad) {
  Device& d = *ctx.device;
  Tensor dy = dy_out;
  if (fused_relu) {  // through the ReLU first: d(pre-activation) = dy where y > 0
    dy = new_act(ctx, dy_out.rows, dy_out.cols);
    d.set_label(op_label("bwd", "relu"));
    d.activation_backward(ctx.compute, Activation::ReLU, saved_y_.data, dy_out.data, dy.data,
                          dy.dtype, dy.numel());
    saved_y_ = Tensor{};
  }
  Tensor dx;
  std::shared_ptr<Fp8Operand> fp8_dy;
  if (input_grad) {  // the first block's dX would be a whole GEMM for nothing
    dx = new_act(ctx, dy.rows, in_);
    if (weight().fp8 != Fp8Recipe::None) {
      d.set_label(op_label("bwd", "fp8 gemm dX"));
      fp8_dy = fp8_linear_input_grad(ctx, fp8_weight(weight()), dy, dx);
    } else {
      d.set_label(op_label("bwd", "gemm dX"));
      d.gemm(ctx.compute, false, false, dy.rows, in_, out_, 1.0f, dy.data, weight().value.data,
             ctx.act_dtype, 0.0f, dx.data, dx.dtype);
    }
  }
  if (defer_weight_grad) {
    deferred_x_ = std::move(saved_x_);
    deferred_dy_ = dy;
    deferred_fp8_x_ = std::move(fp8_x_scales_);
    deferred_fp8_dy_ = std::move(fp8_dy);
  } else {
    weight_grads(ctx, saved_x_, dy, fp8_x_scales_.get(), fp8_dy.get());
  }
  saved_x_ = Tensor{};
  fp8_x_scales_.reset();
  return dx;
}

void Linear::restore_saved_input(Tensor x) {
  FSDP_CHECK(x.cols == in_, "Linear ", fqn(), ": a remade input of ", x.cols, " features, not ",
             in_);
  saved_x_ = std::move(x);
  fp8_x_scales_.reset();  // remade values: the weight grad takes their amax afresh
}

void Linear::drop_own_saved(ActivationCheckpoint what) {
  if (what != ActivationCheckpoint::Full) return;
  saved_x_ = Tensor{};
  saved_y_ = Tensor{};
  fp8_x_scales_.reset();
}

void Linear::flush_deferred_grads(RunContext& ctx) {
  if (!deferred_dy_.defined()) return;
  weight_grads(ctx, deferred_x_, deferred_dy_, deferred_fp8_x_.get(), deferred_fp8_dy_.get());
  deferred_x_ = Tensor{};
  deferred_dy_ = Tensor{};
  deferred_fp8_x_.reset();
  deferred_fp8_dy_.reset();
}

// ---- Act
Tensor Act::forward_impl(RunContext& ctx, const Tensor& x) {
  Tensor y = new_act(ctx, x.rows, x.cols);
  ctx.device->set_label(op_label("fwd", type().c_str()));
  ctx.device->activation_forward(ctx.compute, f_, x.data, y.data, x.dtype, x.numel());
  // ReLU's backward needs only the sign, which its output carries: keep y, which the next
  // Linear keeps anyway (shared storage), instead of a second tensor.
  saved_x_ = f_ == Activation::ReLU ? y : x;
  return y;
}

Tensor Act::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  Tensor dx = new_act(ctx, dy.rows, dy.cols);
  ctx.device->set_label(op_label("bwd", type().c_str()));
  ctx.device->activation_backward(ctx.compute, f_, saved_x_.data, dy.data, dx.data, dy.dtype,
                                  dy.numel());
  saved_x_ = Tensor{};
  return dx;
}

void Act::drop_own_saved(ActivationCheckpoint what) {
  if (what == ActivationCheckpoint::Full) saved_x_ = Tensor{};
}

// ---- Sequential
Tensor Sequential::forward_impl(RunContext& ctx, const Tensor& x) {
  Tensor h = x;
  for (const auto& c : children()) h = c->forward(ctx, h);
  return h;
}

Tensor Sequential::backward_impl(RunContext& ctx, const Tensor& dy, bool input_grad) {
  Tensor g = dy;
  for (auto it = children().rbegin(); it != children().rend(); ++it)
    g = (*it)->backward(ctx, g, input_grad || std::next(it) != children().rend());
  return g;
}

// ---- SpinBlock
SpinBlock::SpinBlock(int64_t dim, double forward_us, double backward_us)
    : Module("SpinBlock"), forward_us_(forward_us), backward_us_(backward_us) {
  FSDP_CHECK(forward_us >= 0 && backward_us >= 0, "spin durations must be >= 0");
  add_param("weight", {dim, dim}, [dim] { return std::vector<float>(static_cast<size_t>(dim * dim), 0.0f); });
}

Tensor SpinBlock::forward_impl(RunContext& ctx, const Tensor& x) {
  ctx.device->set_label(op_label("fwd", "spin"));
  ctx.device->spin(ctx.compute, forward_us_);
  return x;
}

Tensor SpinBlock::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  Param& w = *params()[0];
  ctx.device->set_label(op_label("bwd", "spin"));
  ctx.device->spin(ctx.compute, backward_us_);
  Tensor g = empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, w.rows(), w.cols(), MemTag::Grad);
  ctx.device->fill(ctx.compute, g.data, g.dtype, g.numel(), 0.0f);
  w.set_grad(ctx, std::move(g));
  return dy;
}

// ---- ResidualMlp
ResidualMlp::ResidualMlp(int64_t dim, int64_t hidden, Activation f, uint64_t seed, bool norm)
    : Module("ResidualMlp") {
  if (norm) add_child("norm", std::make_unique<RMSNorm>(dim, kNormEps));  // runs first
  add_child("fc1", std::make_unique<Linear>(dim, hidden, true, seed * 3 + 1));
  add_child("act", std::make_unique<Act>(f));
  add_child("fc2", std::make_unique<Linear>(hidden, dim, true, seed * 3 + 2));
}

Tensor ResidualMlp::forward_impl(RunContext& ctx, const Tensor& x) {
  Tensor h = x;
  for (const auto& c : children()) h = c->forward(ctx, h);
  Tensor y = new_act(ctx, x.rows, x.cols);
  ctx.device->set_label(op_label("fwd", "residual"));
  ctx.device->add(ctx.compute, y.data, x.data, h.data, x.dtype, x.numel());
  return y;
}

Tensor ResidualMlp::backward_impl(RunContext& ctx, const Tensor& dy, bool) {
  Tensor g = dy;
  for (auto it = children().rbegin(); it != children().rend(); ++it) g = (*it)->backward(ctx, g);
  Tensor dx = new_act(ctx, dy.rows, dy.cols);
  ctx.device->set_label(op_label("bwd", "residual"));
  ctx.device->add(ctx.compute, dx.data, dy.data, g.data, dy.dtype, dy.numel());
  return dx;
}

}  // namespace fsdp::nn
