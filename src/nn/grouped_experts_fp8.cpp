// The grouped experts' fp8 path (docs/fp8.md): each local expert's GEMMs as an fp8 Linear's.
//
// Note [Fp8 experts]
// With fp8 on (nn::enable_fp8 marks w13 and w2), each local expert is its own fp8 Linear:
// - Its rows are their own operands: tensorwise, an expert's X and dY take their own amax
//   (rowwise, their own rows' and columns'), so a crowded expert does not set the scale of a
//   quiet one. Its weight is its block of the grouped param (fp8_weight_block): when FSDP's
//   float8 all-gather brought the param, the codes at that block with the param's one scale
//   (its amax over every local expert, Note [Float8 all-gather]); else a cast of the block.
// - cuBLASLt's fp8 GEMMs want m, n and k multiples of 16, and an expert's rows (m forward, k
//   for its weight grad) are whatever the routing gave it. So each expert's rows are copied
//   into a segment padded with zero rows to a multiple of 16. Zero rows change neither an amax
//   nor a sum, so the values are those of the unpadded rows. Every backend pads, so the CPU
//   runs the ops CUDA runs.
// - The counts are on the host (set before forward), so the experts are a loop of fp8 GEMMs,
//   one cuBLASLt call each: this cuBLAS has no grouped fp8 GEMM. Under CUDA graphs the counts
//   are the static shapes' slots, the same at every replay.
// - No fused amax (Note [Fused amax]): SwiGLU's output spans every expert, and each expert
//   scales its own rows.
#include "fsdp/error.h"
#include "fsdp/nn/moe.h"
#include "nn/fp8_linear.h"

namespace fsdp::nn {

namespace {

constexpr int64_t kFp8RowAlign = 16;  // cuBLASLt's fp8 GEMMs: m, n and k multiples of 16

Tensor new_act(RunContext& ctx, int64_t rows, int64_t cols) {
  return empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, rows, cols, MemTag::Activation);
}

// Rows [first, first + rows) of t, viewed.
Tensor rows_of(const Tensor& t, int64_t first, int64_t rows) {
  return view_tensor(static_cast<char*>(t.data) +
                         static_cast<size_t>(first * t.cols) * dtype_size(t.dtype),
                     t.dtype, rows, t.cols, t.storage);
}

// Block `index` ([rows, cols]) of a grouped grad, viewed.
Tensor block_of(const Tensor& t, int64_t index, int64_t rows, int64_t cols) {
  return view_tensor(static_cast<char*>(t.data) +
                         static_cast<size_t>(index * rows * cols) * dtype_size(t.dtype),
                     t.dtype, rows, cols, t.storage);
}

// x's expert segments (from[l] rows each, one after another) into segments of to[l] rows:
// the first min(from[l], to[l]) rows copied, the rest zeros. x itself when the two agree.
Tensor regroup_rows(RunContext& ctx, const Tensor& x, const std::vector<int64_t>& from,
                    const std::vector<int64_t>& to) {
  if (from == to) return x;
  Device& d = *ctx.device;
  int64_t rows = 0;
  for (int64_t n : to) rows += n;
  Tensor out = new_act(ctx, rows, x.cols);
  const size_t row_bytes = static_cast<size_t>(x.cols) * dtype_size(x.dtype);
  int64_t src = 0, dst = 0;
  for (size_t l = 0; l < to.size(); ++l) {
    const int64_t kept = std::min(from[l], to[l]);
    if (kept > 0)
      d.copy(ctx.compute, rows_of(out, dst, kept).data, rows_of(x, src, kept).data,
             static_cast<size_t>(kept) * row_bytes);
    if (to[l] > kept)
      d.fill(ctx.compute, rows_of(out, dst + kept, 0).data, x.dtype, (to[l] - kept) * x.cols, 0.0f);
    src += from[l];
    dst += to[l];
  }
  FSDP_CHECK(src == x.rows, "regroup_rows: segments of ", src, " rows for a tensor of ", x.rows);
  return out;
}

}  // namespace

bool GroupedExperts::fp8() const { return params()[0]->fp8 != Fp8Recipe::None; }

Tensor GroupedExperts::forward_fp8(RunContext& ctx, const Tensor& x) {
  Device& d = *ctx.device;
  Param& p13 = *params()[0];
  Param& p2 = *params()[1];
  std::vector<int64_t> padded(counts.size());
  int64_t rows = 0;
  for (size_t l = 0; l < counts.size(); ++l) {
    padded[l] = (counts[l] + kFp8RowAlign - 1) / kFp8RowAlign * kFp8RowAlign;
    rows += padded[l];
  }
  Tensor xp = regroup_rows(ctx, x, counts, padded);
  Tensor h = new_act(ctx, rows, 2 * ffn_), act = new_act(ctx, rows, ffn_), out = new_act(ctx, rows, dim_);
  fp8_x13_.assign(static_cast<size_t>(local_), nullptr);
  fp8_x2_.assign(static_cast<size_t>(local_), nullptr);
  d.set_label(op_label("fwd", "expert fp8 gemm"));
  for (int l = 0, off = 0; l < local_; off += static_cast<int>(padded[l]), ++l) {
    if (padded[l] == 0) continue;
    Tensor hl = rows_of(h, off, padded[l]);
    fp8_x13_[l] = fp8_linear_forward(ctx, fp8_weight_block(p13, l, 2 * ffn_, dim_),
                                     rows_of(xp, off, padded[l]), hl);
  }
  if (rows > 0) {
    d.set_label(op_label("fwd", "expert swiglu"));
    d.swiglu_forward(ctx.compute, h.data, ctx.act_dtype, rows, ffn_, act.data, nullptr);
  }
  d.set_label(op_label("fwd", "expert fp8 gemm"));
  for (int l = 0, off = 0; l < local_; off += static_cast<int>(padded[l]), ++l) {
    if (padded[l] == 0) continue;
    Tensor outl = rows_of(out, off, padded[l]);
    fp8_x2_[l] = fp8_linear_forward(ctx, fp8_weight_block(p2, l, dim_, ffn_),
                                    rows_of(act, off, padded[l]), outl);
  }
  saved_x_ = std::move(xp);
  saved_h_ = std::move(h);
  saved_act_ = std::move(act);
  saved_counts_ = counts;
  saved_padded_ = std::move(padded);
  return regroup_rows(ctx, out, saved_padded_, saved_counts_);
}

Tensor GroupedExperts::backward_fp8(RunContext& ctx, const Tensor& dy, Tensor& dw13, Tensor& dw2) {
  Device& d = *ctx.device;
  const DType t = ctx.act_dtype;
  const std::vector<int64_t>& padded = saved_padded_;
  const int64_t rows = saved_x_.rows;
  Param& p13 = *params()[0];
  Param& p2 = *params()[1];
  Tensor dyp = regroup_rows(ctx, dy, saved_counts_, padded);
  Tensor dact = new_act(ctx, rows, ffn_), dh = new_act(ctx, rows, 2 * ffn_), dxp = new_act(ctx, rows, dim_);
  // One projection of every expert: dX = dY W (dY's codes kept for dW), dW = dY^T X. An
  // expert without rows has a zero weight grad, which FSDP reduces like any other.
  auto project = [&](Param& w, int64_t out_cols, int64_t in_cols, const Tensor& x_all,
                     const Tensor& dy_all, Tensor& dx_all, Tensor& dw_all,
                     const std::vector<std::shared_ptr<Fp8Operand>>& x_scales) {
    d.set_label(op_label("bwd", "expert fp8 gemm"));
    for (int l = 0, off = 0; l < local_; off += static_cast<int>(padded[l]), ++l) {
      Tensor dw = block_of(dw_all, l, out_cols, in_cols);
      if (padded[l] == 0) {
        d.fill(ctx.compute, dw.data, t, dw.numel(), 0.0f);
        continue;
      }
      const Fp8Weight wl = fp8_weight_block(w, l, out_cols, in_cols);
      const Tensor dyl = rows_of(dy_all, off, padded[l]);
      Tensor dxl = rows_of(dx_all, off, padded[l]);
      const std::shared_ptr<Fp8Operand> dy_codes = fp8_linear_input_grad(ctx, wl, dyl, dxl);
      const Fp8Operand* xs = static_cast<size_t>(l) < x_scales.size() ? x_scales[l].get() : nullptr;
      fp8_linear_weight_grad(ctx, wl, rows_of(x_all, off, padded[l]), dyl, dw, xs, dy_codes.get());
    }
  };
  project(p2, dim_, ffn_, saved_act_, dyp, dact, dw2, fp8_x2_);
  if (rows > 0) {
    d.set_label(op_label("bwd", "expert swiglu"));
    d.swiglu_backward(ctx.compute, saved_h_.data, dact.data, t, rows, ffn_, dh.data, nullptr);
  }
  dact = Tensor{};
  project(p13, 2 * ffn_, dim_, saved_x_, dh, dxp, dw13, fp8_x13_);
  fp8_x13_.clear();
  fp8_x2_.clear();
  return regroup_rows(ctx, dxp, padded, saved_counts_);
}

}  // namespace fsdp::nn
