// The GEMMs of an fp8 Linear (docs/fp8.md): each operand cast to fp8 with scales from its own
// amax, multiplied with fp32 accumulation, the result scaled back. Linear (src/nn/layers.cpp)
// calls these when its weight is marked (Param::fp8).
#pragma once

#include <memory>

#include "fsdp/module.h"

namespace fsdp::nn {

// One GEMM operand in fp8: its codes and inverse scales (one, or one per row or column).
struct Fp8Operand {
  std::shared_ptr<Storage> storage;  // owns both (null for a view of FSDP's gathered weight)
  const uint8_t* data = nullptr;
  const float* scale_inv = nullptr;
  Fp8Format format = Fp8Format::E4M3;
  Device::Fp8Operand device() const { return {data, format, scale_inv}; }
};

// x [rows, cols] in ctx.act_dtype cast to `f`, scaled per tensor or along `axis`: its amax,
// then the cast, on the compute stream.
Fp8Operand fp8_quantize(RunContext& ctx, const Tensor& x, Device::Fp8Axis axis, Fp8Format f);

// y = x W^T, dx = dy W, dw = dy^T x, all three in fp8 (E4M3 for x and W, E5M2 for dy). The
// weight comes from FSDP's float8 all-gather when it brought one (tensorwise), else it is
// cast from w.value.
void fp8_linear_forward(RunContext& ctx, const Param& w, const Tensor& x, Tensor& y);
void fp8_linear_input_grad(RunContext& ctx, const Param& w, const Tensor& dy, Tensor& dx);
void fp8_linear_weight_grad(RunContext& ctx, const Param& w, const Tensor& x, const Tensor& dy,
                            Tensor& dw);

}  // namespace fsdp::nn
