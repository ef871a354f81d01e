#include "nn/fp8_linear.h"

#include "fsdp/error.h"
#include "fsdp/nn/layers.h"
#include "fsdp/nn/model.h"
#include "fsdp/nn/moe.h"

namespace fsdp::nn {

namespace {

using Axis = Device::Fp8Axis;

// Rowwise scales op(X)'s rows when X is not transposed (its rows are op(X)'s rows), its
// columns when it is; for the B side, op(B)'s columns: B's rows when transposed.
Axis a_axis(Fp8Recipe r, bool trans) {
  return r == Fp8Recipe::Tensorwise ? Axis::Tensor : trans ? Axis::Cols : Axis::Rows;
}
Axis b_axis(Fp8Recipe r, bool trans) {
  return r == Fp8Recipe::Tensorwise ? Axis::Tensor : trans ? Axis::Rows : Axis::Cols;
}

// The weight as the GEMM's operand: FSDP's fp8 copy when it gathered one (tensorwise: one
// scale serves both layouts, and every block of a grouped param), else a cast of the gathered
// value.
Fp8Operand weight_operand(RunContext& ctx, const Fp8Weight& w, Axis axis) {
  const Param& p = *w.param;
  FSDP_CHECK(w.first >= 0 && w.rows >= 0 && w.cols >= 0 && w.first + w.rows * w.cols <= p.numel(),
             "param ", p.name(), ": a block of ", w.rows, "x", w.cols, " at ", w.first,
             " outside its ", p.numel(), " elements");
  if (p.fp8_value) {
    FSDP_CHECK(axis == Axis::Tensor, "param ", p.name(), ": a float8-gathered weight has one scale");
    Fp8Operand op;
    op.data = p.fp8_value + w.first;
    op.scale_inv = p.fp8_scale_inv;
    return op;
  }
  FSDP_CHECK(p.value.defined(), "param ", p.name(), " is not gathered");
  const Tensor block = view_tensor(static_cast<char*>(p.value.data) +
                                       static_cast<size_t>(w.first) * dtype_size(p.value.dtype),
                                   p.value.dtype, w.rows, w.cols);
  return fp8_quantize(ctx, block, axis, Fp8Format::E4M3);
}

void gemm(RunContext& ctx, Fp8Recipe r, bool trans_a, bool trans_b, int64_t m, int64_t n,
          int64_t k, const Fp8Operand& a, const Fp8Operand& b, Tensor& c) {
  ctx.device->fp8_gemm(ctx.compute, trans_a, trans_b, m, n, k, a.device(), b.device(),
                       r == Fp8Recipe::Rowwise, c.data, c.dtype);
}

}  // namespace

Fp8Operand fp8_quantize(RunContext& ctx, const Tensor& x, Axis axis, Fp8Format f, Fp8Codes codes,
                        const Fp8Operand* amax_of) {
  Device& d = *ctx.device;
  const int64_t scales = axis == Axis::Tensor ? 1 : axis == Axis::Rows ? x.rows : x.cols;
  // The amaxes, then the inverse scales, each 16-byte aligned (Note [Fp8 scales 16-byte
  // aligned] in fsdp/fp8.h).
  const int64_t slots = fp8_scale_slots(scales);
  Fp8Operand op;
  op.format = f;
  const size_t n = static_cast<size_t>(x.numel());
  auto code_storage = [&] { return std::make_shared<Storage>(d, n, ctx.compute, MemTag::Activation); };
  if (codes != Fp8Codes::Transposed) op.codes = code_storage();
  if (codes != Fp8Codes::Plain) op.codes_t = code_storage();
  float* scale_inv = nullptr;  // not rewritten when the amax is another operand's
  if (amax_of) {
    FSDP_CHECK(amax_of->amax, "fp8_quantize: the operand to take the amax of has none");
    op.scales = amax_of->scales;
    op.amax = amax_of->amax;
    op.scale_inv = amax_of->scale_inv;
  } else if (axis == Axis::Tensor && x.fp8_amax) {  // Note [Fused amax]: its producer took it
    FSDP_CHECK(x.fp8_amax->bytes() >= 2 * static_cast<size_t>(slots) * sizeof(float),
               "fp8_quantize: a fused amax buffer of ", x.fp8_amax->bytes(), " bytes");
    op.scales = x.fp8_amax;
    auto* amax = static_cast<float*>(op.scales->data());
    scale_inv = amax + slots;
    op.amax = amax;
    op.scale_inv = scale_inv;
  } else {
    op.scales = std::make_shared<Storage>(d, 2 * static_cast<size_t>(slots) * sizeof(float),
                                          ctx.compute, MemTag::Activation);
    auto* amax = static_cast<float*>(op.scales->data());
    scale_inv = amax + slots;
    d.fp8_amax(ctx.compute, x.data, x.dtype, x.rows, x.cols, axis, amax);
    op.amax = amax;
    op.scale_inv = scale_inv;
  }
  auto* q = op.codes ? static_cast<uint8_t*>(op.codes->data()) : nullptr;
  auto* q_t = op.codes_t ? static_cast<uint8_t*>(op.codes_t->data()) : nullptr;
  d.fp8_cast(ctx.compute, x.data, x.dtype, x.dtype, x.rows, x.cols, axis, op.amax, f, q, q_t,
             scale_inv);
  op.data = q;
  op.data_t = q_t;
  return op;
}

float* attach_fused_amax(RunContext& ctx, const Param& w, Tensor& out) {
  if (w.fp8 != Fp8Recipe::Tensorwise) return nullptr;
  out.fp8_amax = std::make_shared<Storage>(
      *ctx.device, 2 * static_cast<size_t>(fp8_scale_slots(1)) * sizeof(float), ctx.compute,
      MemTag::Activation);
  return static_cast<float*>(out.fp8_amax->data());
}

std::shared_ptr<Fp8Operand> fp8_linear_forward(RunContext& ctx, const Fp8Weight& w,
                                               const Tensor& x, Tensor& y, bool keep_x_codes) {
  const Fp8Recipe r = w.recipe();
  const bool tensorwise = r == Fp8Recipe::Tensorwise;
  auto qx = std::make_shared<Fp8Operand>(fp8_quantize(
      ctx, x, a_axis(r, false), Fp8Format::E4M3,
      tensorwise && keep_x_codes ? Fp8Codes::Both : Fp8Codes::Plain));
  const Fp8Operand qw = weight_operand(ctx, w, b_axis(r, true));
  gemm(ctx, r, false, true, x.rows, w.rows, w.cols, *qx, qw, y);
  // Note [Fp8 operands reused by the weight grad]: X's tensorwise amax, and X^T's codes when
  // asked.
  if (!tensorwise) return nullptr;
  qx->drop_plain_codes();
  return qx;
}

std::shared_ptr<Fp8Operand> fp8_linear_input_grad(RunContext& ctx, const Fp8Weight& w,
                                                  const Tensor& dy, Tensor& dx) {
  const Fp8Recipe r = w.recipe();
  const bool tensorwise = r == Fp8Recipe::Tensorwise;
  auto qdy = std::make_shared<Fp8Operand>(fp8_quantize(
      ctx, dy, a_axis(r, false), Fp8Format::E5M2, tensorwise ? Fp8Codes::Both : Fp8Codes::Plain));
  const Fp8Operand qw = weight_operand(ctx, w, b_axis(r, false));
  gemm(ctx, r, false, false, dy.rows, w.cols, w.rows, *qdy, qw, dx);
  if (!tensorwise) return nullptr;
  qdy->drop_plain_codes();  // the weight grad reads dY^T
  return qdy;
}

void fp8_linear_weight_grad(RunContext& ctx, const Fp8Weight& w, const Tensor& x,
                            const Tensor& dy, Tensor& dw, const Fp8Operand* x_scales,
                            const Fp8Operand* dy_codes) {
  const Fp8Recipe r = w.recipe();
  // dW = dY^T X: A = dY^T [out, tokens] and B with op(B) = X, i.e. X^T [in, tokens] in the
  // [n, k] layout: both are the transposed codes, so the GEMM transposes nothing.
  Fp8Operand qdy;
  if (dy_codes && dy_codes->data_t)
    qdy = *dy_codes;
  else
    qdy = fp8_quantize(ctx, dy, a_axis(r, true), Fp8Format::E5M2, Fp8Codes::Transposed);
  const bool reuse = x_scales && x_scales->amax && r == Fp8Recipe::Tensorwise;
  Fp8Operand qx;
  if (reuse && x_scales->data_t) {
    qx = *x_scales;  // the forward's X^T codes
  } else {
    FSDP_CHECK(x.defined() && x.rows == dy.rows, "fp8 weight grad of ", w.param->name(),
               ": no kept input for its ", dy.rows, " rows");
    qx = fp8_quantize(ctx, x, b_axis(r, false), Fp8Format::E4M3, Fp8Codes::Transposed,
                      reuse ? x_scales : nullptr);
  }
  ctx.device->fp8_gemm(ctx.compute, false, true, w.rows, w.cols, dy.rows, qdy.device_t(),
                       qx.device_t(), r == Fp8Recipe::Rowwise, dw.data, dw.dtype);
}

int enable_fp8(Model& model, Fp8Recipe recipe) {
  if (recipe == Fp8Recipe::None) return 0;
  int marked = 0;
  for (Module* block : model.blocks())
    block->visit([&](Module& m) {
      if (auto* experts = dynamic_cast<GroupedExperts*>(&m)) {  // Note [Fp8 experts]
        for (const auto& p : experts->params()) p->fp8 = recipe;
        ++marked;
        return;
      }
      auto* linear = dynamic_cast<Linear*>(&m);
      if (!linear) return;
      const std::string& fqn = linear->fqn();
      if (fqn.size() >= 6 && fqn.compare(fqn.size() - 6, 6, "router") == 0) return;
      if (linear->fused_relu)
        throw OptionError::of(OptionName{"fp8"}, " needs Linears without a fused ReLU; the ",
                              model.config().kind, " model's blocks fuse theirs (", fqn, ")");
      linear->weight().fp8 = recipe;
      ++marked;
    });
  if (marked == 0)
    throw OptionError::of(OptionName{"fp8"}, " found no Linear inside the ", model.config().kind,
                          " model's blocks");
  return marked;
}

}  // namespace fsdp::nn
