// Row gathers and scatter-adds for the MoE layer, through the embedding ops (a gather by int32
// index and its deterministic scatter-add). Zero rows are allowed: an expert or a peer may
// get no tokens, and the ops below then do nothing (or write zeros).
#pragma once

#include <vector>

#include "fsdp/module.h"
#include "fsdp/tensor.h"

namespace fsdp::nn {

// int32 [n, 1] on the device (no data when n == 0).
inline Tensor device_ids(RunContext& ctx, const std::vector<int32_t>& ids,
                         MemTag tag = MemTag::Activation) {
  Tensor t = empty_tensor(*ctx.device, ctx.compute, DType::I32, static_cast<int64_t>(ids.size()),
                          1, tag);
  if (!ids.empty()) ctx.device->copy_from_host(ctx.compute, t.data, ids.data(), t.bytes());
  return t;
}

// out[i, :] = src[ids[i], :] for i < rows (act dtype).
inline Tensor gather_rows(RunContext& ctx, const Tensor& src, const Tensor& ids, int64_t rows,
                          int64_t cols) {
  Tensor out = empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, rows, cols, MemTag::Activation);
  if (rows > 0)
    ctx.device->embedding_forward(ctx.compute, src.data, ctx.act_dtype, ids.as<int32_t>(), rows,
                                  cols, out.data);
  return out;
}

// out[v, :] = sum of src[i, :] over the i < rows with ids[i] == v, for v < out_rows; rows no
// id names are 0. Summed in fp32 in row order.
inline Tensor scatter_add_rows(RunContext& ctx, const Tensor& src, const Tensor& ids, int64_t rows,
                               int64_t cols, int64_t out_rows) {
  Tensor out =
      empty_tensor(*ctx.device, ctx.compute, ctx.act_dtype, out_rows, cols, MemTag::Activation);
  if (out_rows == 0) return out;
  if (rows > 0)
    ctx.device->embedding_backward(ctx.compute, src.data, ctx.act_dtype, ids.as<int32_t>(), rows,
                                   cols, out_rows, out.data);
  else
    ctx.device->fill(ctx.compute, out.data, ctx.act_dtype, out_rows * cols, 0.0f);
  return out;
}

// The row `row` of a [*, cols] tensor in dtype t.
inline void* row_ptr(const Tensor& t, int64_t row, int64_t cols) {
  return static_cast<char*>(t.data) + static_cast<size_t>(row * cols) * dtype_size(t.dtype);
}

}  // namespace fsdp::nn
