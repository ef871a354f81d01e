// The GEMMs of an fp8 Linear (docs/fp8.md): each operand cast to fp8 with scales from its own
// amax, multiplied with fp32 accumulation, the result scaled back. Linear (src/nn/layers.cpp)
// calls these when its weight is marked (Param::fp8).
#pragma once

#include <memory>

#include "fsdp/module.h"

namespace fsdp::nn {

// One GEMM operand in fp8: its codes as they are ([rows, cols]) and/or transposed
// ([cols, rows], the layout in which cuBLASLt reads an operand the GEMM transposes), its amaxes
// and inverse scales (one, or one per row or column). Each part has its own storage, so the
// plain codes can go once their GEMM ran while the transposed ones wait for the weight grad.
struct Fp8Operand {
  std::shared_ptr<Storage> codes, codes_t, scales;  // null for a view of FSDP's gathered weight
  const uint8_t* data = nullptr;
  const uint8_t* data_t = nullptr;
  const float* amax = nullptr;
  const float* scale_inv = nullptr;
  Fp8Format format = Fp8Format::E4M3;
  Device::Fp8Operand device() const { return {data, format, scale_inv}; }
  Device::Fp8Operand device_t() const { return {data_t, format, scale_inv}; }
  void drop_plain_codes() {
    codes.reset();
    data = nullptr;
  }
};

enum class Fp8Codes { Plain, Transposed, Both };  // which of the two layouts to write

// x [rows, cols] in ctx.act_dtype cast to `f`, scaled per tensor or along `axis`: its amax,
// then the cast, on the compute stream. With `amax_of` (an earlier quantization of the same
// values along the same axis) its amax serves and the amax pass is skipped; so does x's own
// fp8_amax, per tensor, which the kernel that made x wrote (Note [Fused amax]).
Fp8Operand fp8_quantize(RunContext& ctx, const Tensor& x, Device::Fp8Axis axis, Fp8Format f,
                        Fp8Codes codes = Fp8Codes::Plain, const Fp8Operand* amax_of = nullptr);

// Note [Fused amax]
// A tensorwise fp8 GEMM scales its input by the input's amax, which a separate pass would read
// the whole tensor for. Where one kernel makes that input (SwiGLU's output, the w2 GEMM's X;
// SwiGLU's backward, the w13 GEMM's dY; a norm's output, wqkv's and w13's X; a norm's input
// gradient, which is the residual's gradient: wo's dY, and the w2 dY of the block before, or of
// the last block for the final norm), it takes the amax of what it writes, in registers, and
// the tensor carries it (Tensor::fp8_amax) to fp8_quantize: the same max, NaN included, so the
// same codes, one pass fewer. attach_fused_amax gives `out` its buffer when the GEMM that reads
// it has a tensorwise fp8 weight `w`, and returns where its kernel writes the amax (null: none).
float* attach_fused_amax(RunContext& ctx, const Param& w, Tensor& out);
// The same for a GEMM that may not be there (w null: none reads `out` in fp8).
inline float* attach_fused_amax(RunContext& ctx, const Param* w, Tensor& out) {
  return w ? attach_fused_amax(ctx, *w, out) : nullptr;
}

// A weight as the fp8 GEMMs read it: a Linear's whole weight, or one expert's [rows, cols]
// block of a grouped param (experts one after another along dim 0). Its values are the
// gathered `value`'s rows or, when FSDP's float8 all-gather brought the param, its E4M3 codes
// at the same offset with the param's one inverse scale (Note [Float8 all-gather]).
struct Fp8Weight {
  const Param* param = nullptr;  // the recipe, and the name for errors
  int64_t first = 0;             // its first element in the param
  int64_t rows = 0, cols = 0;
  Fp8Recipe recipe() const { return param->fp8; }
};
inline Fp8Weight fp8_weight(const Param& w) { return {&w, 0, w.rows(), w.cols()}; }
// Block `index` of a param that holds equal [rows, cols] blocks (a grouped expert's weight).
inline Fp8Weight fp8_weight_block(const Param& w, int64_t index, int64_t rows, int64_t cols) {
  return {&w, index * rows * cols, rows, cols};
}

// y = x W^T, dx = dy W, dw = dy^T x, all three in fp8 (E4M3 for x and W, E5M2 for dy). The
// weight comes from FSDP's float8 all-gather when it brought one (tensorwise), else it is
// cast from w.value.
//
// Note [Fp8 operands reused by the weight grad]: the weight grad reads dY^T and X^T, which
// cuBLASLt takes only as transposed codes. Tensorwise, the scales are the same for the forward
// or dX and for dW, so each operand is cast once: the forward casts X into both layouts and
// keeps X^T's codes for the weight grad (one byte an element, where the bf16 X it replaces is
// two: a Linear that keeps them keeps no X, Linear::has_saved_input), and the input grad casts
// dY once into both layouts and hands them on. Without the codes (keep_x_codes false, or a
// checkpoint dropped them) the weight grad casts X^T with the forward's amax, kept, in one
// pass. Rowwise scales run along other axes there, so the weight grad takes its own amaxes,
// still writing the transposed codes directly. Either way no separate transpose pass is left.
//
// fp8_linear_forward returns x's scales (and, with keep_x_codes, its transposed codes) for
// the weight grad (empty when it cannot reuse them); fp8_linear_input_grad returns dy's codes
// likewise; fp8_linear_weight_grad takes either, or null, and x may then be empty (its rows are
// dy's).
std::shared_ptr<Fp8Operand> fp8_linear_forward(RunContext& ctx, const Fp8Weight& w,
                                               const Tensor& x, Tensor& y,
                                               bool keep_x_codes = false);
std::shared_ptr<Fp8Operand> fp8_linear_input_grad(RunContext& ctx, const Fp8Weight& w,
                                                  const Tensor& dy, Tensor& dx);
void fp8_linear_weight_grad(RunContext& ctx, const Fp8Weight& w, const Tensor& x,
                            const Tensor& dy, Tensor& dw, const Fp8Operand* x_scales,
                            const Fp8Operand* dy_codes);

}  // namespace fsdp::nn
