"""Tensorwise float8 Linears for `bench/torch_llama.py --fp8 tensorwise`: PyTorch's own fp8 GEMM
(torch._scaled_mm, cuBLASLt underneath) with the recipe of `fsdp train --fp8 tensorwise`
(docs/fp8.md), so that a PyTorch row does the same math where torchao is not installed:

- the blocks' Linears (wqkv, wo, w13, w2) only; the embedding, the head, the norms and the
  attention stay bf16;
- dynamic tensorwise scales, scale = fp8 max / amax (amax floored at 1e-12), from each
  tensor's amax in this step: E4M3 for the input X and the weight W, E5M2 for the gradient dY;
- y = X W^T, dX = dY W and dW = dY^T X, all three in fp8 with fp32 accumulation and bf16
  output; the backward reuses the forward's codes of X and W (saved: 1 byte an element).

What differs from ours, said in the rows that use it: FSDP2 all-gathers the bf16 weight and
this casts it after the gather (ours gathers the fp8 codes, half the bytes), and the casts are
PyTorch ops (an amax, a multiply, a clamp and a conversion each) where ours are fused kernels.
"""
import torch
import torch.nn as nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
E4M3_MAX, E5M2_MAX = torch.finfo(E4M3).max, torch.finfo(E5M2).max  # 448 and 57344
AMAX_FLOOR = 1e-12


def to_float8(x, dtype, max_value):
    """x's codes and the inverse of its scale (a float32 scalar on the device: no host sync)."""
    amax = x.detach().abs().max().float().clamp(min=AMAX_FLOOR)
    scale = max_value / amax
    codes = (x.float() * scale).clamp(-max_value, max_value).to(dtype)  # saturate, as ours
    return codes, scale.reciprocal()


def column_major(codes):
    """The same matrix laid out column-major: torch._scaled_mm's second operand."""
    return codes.t().contiguous().t()


def scaled_mm(a, b, a_scale_inv, b_scale_inv, out_dtype):
    return torch._scaled_mm(a, b, scale_a=a_scale_inv, scale_b=b_scale_inv, out_dtype=out_dtype)


class Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        rows = x.reshape(-1, x.shape[-1])
        qx, sx = to_float8(rows, E4M3, E4M3_MAX)
        qw, sw = to_float8(weight, E4M3, E4M3_MAX)
        # W is [out, in], row-major: W^T's column-major layout is W itself, transposed.
        y = scaled_mm(qx, qw.t(), sx, sw, x.dtype)
        ctx.save_for_backward(qx, sx, qw, sw)
        ctx.input_shape = x.shape
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, dy):
        qx, sx, qw, sw = ctx.saved_tensors
        rows = dy.reshape(-1, dy.shape[-1])
        qdy, sdy = to_float8(rows, E5M2, E5M2_MAX)
        dx = scaled_mm(qdy, column_major(qw), sdy, sw, dy.dtype)        # [M, out] x [out, in]
        dw = scaled_mm(qdy.t().contiguous(), column_major(qx), sdy, sx, dy.dtype)  # [out, M] x [M, in]
        return dx.reshape(ctx.input_shape), dw


class Float8Linear(nn.Linear):
    """nn.Linear (no bias) whose forward is Float8Matmul; its parameters are unchanged."""

    def forward(self, x):
        return Float8Matmul.apply(x, self.weight)


def convert_blocks(model, names=("attention.wqkv", "attention.wo", "feed_forward.w13", "feed_forward.w2")):
    """Every block's Linears named in `names` become Float8Linear, before fully_shard."""
    converted = 0
    for block in model.layers:
        for name in names:
            try:
                linear = block.get_submodule(name)
            except AttributeError:
                linear = None
            if type(linear) is not nn.Linear or linear.bias is not None:
                raise ValueError(f"--fp8: {name} is not a Linear without bias")
            linear.__class__ = Float8Linear
            converted += 1
    return converted
