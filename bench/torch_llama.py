#!/usr/bin/env python3
"""PyTorch FSDP2 reference for `fsdp train --model transformer` (docs/data.md, "Parity with PyTorch").

One GPU:   python3 bench/torch_llama.py --data DIR/train.bin --vocab 4096 ... --out torch.json
N GPUs:    torchrun --standalone --nproc_per_node=N bench/torch_llama.py ... --out torch.json

The model is the engine's, parameter for parameter (same fqns):
  tok_embeddings.weight [V, D]; per block: attention_norm.weight [D], attention.wqkv.weight
  [(H + 2 KV) hd, D] (rows: q heads, k heads, v heads), attention.wo.weight [D, H hd],
  ffn_norm.weight [D], feed_forward.w13.weight [2 F, D] (rows: gate, then up),
  feed_forward.w2.weight [D, F]; norm.weight [D]; output.weight [V, D] (untied head).
  RMSNorm eps 1e-5 (x * rstd * w in fp32, one rounding); RoPE with Hugging Face's rotate-half
  pairing, theta 10000, positions 0..T-1 in each sequence; causal grouped-query SDPA, scale
  1/sqrt(hd); SwiGLU silu(gate) * up in fp32; cross-entropy averaged over the rank's tokens on
  fp32 logits; block = x + attn(attention_norm(x)), then h + ffn(ffn_norm(h)).
Training: fully_shard on every block and on the root, MixedPrecisionPolicy(param dtype from
--param-dtype, reduce fp32), fp32 master weights; AdamW(betas 0.9/0.95, eps 1e-8, weight decay
0.1 on every parameter, decoupled, fused); lr for step s (0-based): lr * (s + 1) / warmup while
s < warmup, then min_lr + (lr - min_lr) * (1 + cos(pi * (s - warmup) / (steps - warmup - 1))) / 2;
global grad-norm clipping (grads *= min(1, clip / (norm + 1e-6)), skipped when --clip-grad-norm
is 0). TF32 is off, so fp32 runs are fp32.
Batches: bench/llm_data.py, the sampler of docs/data.md, bit for bit: rank r of W reads
sequences [r B, (r + 1) B) of each global batch of W B windows.
Weights: --init-from a safetensors file with Hugging Face Llama names (what `fsdp export`
writes); without it, N(0, 0.02) weights and unit norms from --seed (no parity then).
MFU: flops per token = 6 N + 12 L D T (PaLM; N = parameters less the token embedding, the
head counted; causal attention counted in full), times tokens/s per GPU, over --peak-tflops.
"""
import os

# NVLink SHARP / multicast stays off on the GPU machines (as in bench/torch_fsdp2.py). Set before
# torch.distributed is imported so that torchrun's children see them too.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import argparse
import json
import math
import statistics
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm_data  # noqa: E402  (bench/llm_data.py: token files and the sampler)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:  # PyTorch >= 2.6
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # older releases kept FSDP2 under _composable
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard


def offload_policy(a):
    """fully_shard's keyword for --cpu-offload: FSDP2's CPUOffloadPolicy keeps the sharded
    params, their grads and the optimizer's state in pinned host memory, and the optimizer
    (the same AdamW, fused on the CPU) steps there."""
    if not a.cpu_offload:
        return {}
    try:
        from torch.distributed.fsdp import CPUOffloadPolicy
    except ImportError:
        from torch.distributed._composable.fsdp import CPUOffloadPolicy
    return {"offload_policy": CPUOffloadPolicy(pin_memory=True)}


try:
    from torch.distributed.tensor import DTensor
except ImportError:
    from torch.distributed._tensor import DTensor

NORM_EPS = 1e-5
INIT_STD = 0.02


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return (xf * rstd * self.weight.float()).to(x.dtype)


def rope_tables(seq_len, head_dim, theta, device):
    """cos and sin [T, hd/2] of angle pos * theta^(-2i/hd), computed in fp64, kept in fp32."""
    i = torch.arange(0, head_dim // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def apply_rope(x, cos, sin):
    """Rotate-half RoPE on x [B, T, heads, hd]: element i < hd/2 pairs with i + hd/2."""
    xf = x.float()
    half = xf.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads, seq_len, theta):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        hd = self.head_dim
        self.wqkv = nn.Linear(dim, (heads + 2 * kv_heads) * hd, bias=False)
        self.wo = nn.Linear(heads * hd, dim, bias=False)
        # fp32 tables as buffers of this module: FSDP's mixed precision casts parameters and
        # floating-point forward inputs, not buffers, so RoPE's angles stay fp32 in bf16 runs.
        # Filled by reset_rope() once the module has its device (it is built on "meta").
        self.seq_len, self.theta = seq_len, theta
        self.register_buffer("rope_cos", torch.empty(seq_len, hd // 2), persistent=False)
        self.register_buffer("rope_sin", torch.empty(seq_len, hd // 2), persistent=False)

    def reset_rope(self):
        cos, sin = rope_tables(self.seq_len, self.head_dim, self.theta, self.rope_cos.device)
        with torch.no_grad():
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def forward(self, x):
        b, t, _ = x.shape
        h, kv, hd = self.heads, self.kv_heads, self.head_dim
        q, k, v = self.wqkv(x).split([h * hd, kv * hd, kv * hd], dim=-1)
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        q = apply_rope(q.view(b, t, h, hd), cos, sin).transpose(1, 2)
        k = apply_rope(k.view(b, t, kv, hd), cos, sin).transpose(1, 2)
        v = v.view(b, t, kv, hd).transpose(1, 2)
        # enable_gqa rather than kv heads expanded by hand: on one H200 with PyTorch 2.11 the
        # expanded form was no faster at 4 sequences (204.0 vs 203.2 ms a step) and slower at 1
        # (153.5 vs 106.5 ms). The enable_gqa rows: bench/runs/2026-12-01-llama1b-vs-fsdp2; the
        # expanded form's raw output is not committed (docs/performance.md).
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, h * hd))


class FeedForward(nn.Module):
    def __init__(self, dim, ffn_dim):
        super().__init__()
        self.ffn_dim = ffn_dim
        self.w13 = nn.Linear(dim, 2 * ffn_dim, bias=False)  # rows: gate (w1), then up (w3)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x):
        gate, up = self.w13(x).split([self.ffn_dim, self.ffn_dim], dim=-1)
        return self.w2((F.silu(gate.float()) * up.float()).to(x.dtype))


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.attention_norm = RMSNorm(a.dim)
        self.attention = Attention(a.dim, a.heads, a.kv_heads, a.seq_len, a.rope_theta)
        self.ffn_norm = RMSNorm(a.dim)
        self.feed_forward = FeedForward(a.dim, a.ffn_dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok_embeddings = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.dim)
        self.output = nn.Linear(a.dim, a.vocab, bias=False)
        self.tied = a.tie_embeddings
        self.tie()

    def tie(self):  # one parameter for the embedding and the head (Llama 3.2); to_empty unties
        if self.tied:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def expected_param_count(a):
    hd = a.dim // a.heads
    block = 2 * a.dim + (a.heads + 2 * a.kv_heads) * hd * a.dim + a.heads * hd * a.dim + 3 * a.dim * a.ffn_dim
    return (1 if a.tie_embeddings else 2) * a.vocab * a.dim + a.layers * block + a.dim


def init_weights(model, seed):
    """Unit norms, N(0, INIT_STD) matrices; every rank draws the same numbers (same seed)."""
    gen = torch.Generator(device=model.norm.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, INIT_STD, generator=gen)


# ---------------------------------------------------------------------------------------------
# safetensors with Hugging Face Llama names
# ---------------------------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                      "F64": torch.float64}


def read_safetensors(path):
    """name -> CPU tensor. The `safetensors` package when installed, else the format itself:
    8-byte little-endian header length, JSON header {name: {dtype, shape, data_offsets}}, bytes."""
    try:
        from safetensors.torch import load_file
        return load_file(path)
    except ImportError:
        pass
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        sys.exit(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack_from("<Q", data, 0)
    if 8 + n > len(data):
        sys.exit(f"{path}: not a safetensors file (header length {n} beyond the file's {len(data)} bytes)")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            sys.exit(f"{path}: tensor {name} has dtype {info['dtype']}, not one of {sorted(SAFETENSORS_DTYPES)}")
        begin, end = info["data_offsets"]
        shape = info["shape"]
        numel = math.prod(shape)
        if not (0 <= begin <= end <= len(data) - base) or end - begin != numel * torch.empty((), dtype=dtype).element_size():
            sys.exit(f"{path}: tensor {name}: offsets {begin}..{end} do not fit shape {shape} {info['dtype']}")
        if numel == 0:
            out[name] = torch.empty(shape, dtype=dtype)
        else:
            out[name] = torch.frombuffer(bytearray(data[base + begin:base + end]), dtype=dtype).reshape(shape)
    return out


def dense_ffn_from_hf(i, take, sd):
    """Block i's dense feed-forward from its Llama names (gate and up concatenated by rows)."""
    p = f"model.layers.{i}."
    sd[f"layers.{i}.feed_forward.w13.weight"] = torch.cat(
        [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")], dim=0)
    sd[f"layers.{i}.feed_forward.w2.weight"] = take(p + "mlp.down_proj.weight")


def hf_to_engine(hf, a, ffn_from_hf=dense_ffn_from_hf):
    """Hugging Face Llama names -> the engine's fqns (q/k/v and gate/up concatenated by rows).
    ffn_from_hf(i, take, sd) fills block i's feed-forward (bench/torch_moe.py: MoE blocks)."""
    hf = dict(hf)
    sd = {}

    def take(name):
        if name not in hf:
            sys.exit(f"--init-from: tensor {name} is missing")
        return hf.pop(name).float()

    sd["tok_embeddings.weight"] = take("model.embed_tokens.weight")
    for i in range(a.layers):
        p = f"model.layers.{i}."
        sd[f"layers.{i}.attention_norm.weight"] = take(p + "input_layernorm.weight")
        sd[f"layers.{i}.attention.wqkv.weight"] = torch.cat(
            [take(p + "self_attn.q_proj.weight"), take(p + "self_attn.k_proj.weight"),
             take(p + "self_attn.v_proj.weight")], dim=0)
        sd[f"layers.{i}.attention.wo.weight"] = take(p + "self_attn.o_proj.weight")
        sd[f"layers.{i}.ffn_norm.weight"] = take(p + "post_attention_layernorm.weight")
        ffn_from_hf(i, take, sd)
    sd["norm.weight"] = take("model.norm.weight")
    sd["output.weight"] = take("lm_head.weight")
    if hf:
        sys.exit(f"--init-from: unexpected tensors {sorted(hf)[:5]} (does --layers match?)")
    return sd


def load_initial_weights(model, path, a, spec):
    sd = spec.hf_to_engine(read_safetensors(path), a)
    own = dict(model.named_parameters())
    for name, t in sd.items():
        if tuple(t.shape) != tuple(own[name].shape):
            sys.exit(f"--init-from: {name} has shape {tuple(t.shape)}, the model {tuple(own[name].shape)}")
    with torch.no_grad():
        for name, t in sd.items():
            own[name].copy_(t)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

def lr_at(step, a):
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    decay_steps = a.steps - a.warmup_steps - 1  # the last step runs at min_lr, as fsdp train's
    if decay_steps <= 0:
        return a.lr
    progress = min(1.0, (step - a.warmup_steps) / decay_steps)
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1.0 + math.cos(math.pi * progress))


def grad_norm_and_clip(model, max_norm, groups=None):
    """Global L2 norm of all gradient shards (one all-reduce inside full_tensor), then clipping.
    groups: [(params, process group or None)] for params on different meshes (bench/torch_moe.py):
    each group's squared norm, summed over its process group too when one is given (the experts'
    ep group: each ep rank's shards hold other experts), then added up."""
    if groups is None:
        groups = [(list(model.parameters()), None)]
    groups = [([p for p in ps if p.grad is not None], pg) for ps, pg in groups]
    if len(groups) == 1 and groups[0][1] is None and not hasattr(torch.nn.utils, "get_total_norm"):
        params = groups[0][0]  # PyTorch < 2.6
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm
    square = None
    for params, pg in groups:
        if not params:
            continue
        n = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0, foreach=True)
        if isinstance(n, DTensor):
            n = n.full_tensor()
        n = n.float() ** 2
        if pg is not None:
            dist.all_reduce(n, group=pg)
        square = n if square is None else square + n
    norm = square.sqrt()
    if max_norm > 0:
        for params, _ in groups:
            if params:
                torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return norm


def token_tensor(tokens):
    """A token array of either layout -> int32 CPU tensor: uint16 read as int16, then masked;
    uint32 read as int32 as it is (ids < vocab <= 2^31, checked when the file was read)."""
    if tokens.itemsize == 4:
        return torch.frombuffer(tokens, dtype=torch.int32).clone()
    return torch.frombuffer(tokens, dtype=torch.int16).to(torch.int32) & 0xFFFF


def batch_of(tokens, windows, seq_len, device):
    rows = torch.stack([tokens[w * seq_len:w * seq_len + seq_len + 1] for w in windows])
    rows = rows.to(device=device, dtype=torch.long)
    return rows[:, :-1], rows[:, 1:]


def loss_of(model, inputs, labels):
    logits = model(inputs)
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


class LlamaSpec:
    """What differs between the models this driver trains (bench/torch_moe.py subclasses it)."""
    description = __doc__
    engine_name = "torch-fsdp2"

    def add_args(self, model_group):
        pass

    def check_args(self, parser, a):
        pass

    def setup(self, a, rank, world):  # after init_process_group: meshes, process groups
        pass

    def build(self, a):
        return Transformer(a)

    def expected_param_count(self, a):
        return expected_param_count(a)

    def hf_to_engine(self, hf, a):
        return hf_to_engine(hf, a)

    def init_weights(self, model, a):
        init_weights(model, a.seed)

    def shard(self, model, a, mp):
        extra = offload_policy(a)
        for block in model.layers:
            fully_shard(block, mp_policy=mp, reshard_after_forward=bool(a.reshard_after_forward), **extra)
        fully_shard(model, mp_policy=mp, **extra)

    def loss(self, model, inputs, labels):
        return loss_of(model, inputs, labels)

    def grad_norm_and_clip(self, model, max_norm):
        return grad_norm_and_clip(model, max_norm)

    def flops_params(self, a, params):
        """The params that count for flops per token (non-embedding), and a description."""
        if a.tie_embeddings:  # the one weight is also the head's GEMM, which counts
            return params, "params (tied: the embedding is the head)"
        return params - a.vocab * a.dim, "params - vocab * dim"

    def config_name(self, a):
        return f"llama L{a.layers} D{a.dim} T{a.seq_len} V{a.vocab} {a.param_dtype}"

    def summary(self, model, a):  # extra fields of the JSON summary
        return {}


def parse_args(spec):
    p = argparse.ArgumentParser(description=spec.description, formatter_class=argparse.RawDescriptionHelpFormatter)
    m = p.add_argument_group("model (as `fsdp train --model transformer`)")
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--dim", type=int, default=256)
    m.add_argument("--heads", type=int, default=8)
    m.add_argument("--kv-heads", type=int, default=4)
    m.add_argument("--ffn-dim", type=int, default=704)
    m.add_argument("--seq-len", type=int, default=256)
    m.add_argument("--vocab", type=int, required=True)
    m.add_argument("--rope-theta", type=float, default=10000.0)
    m.add_argument("--tie-embeddings", action="store_true",
                   help="the head uses the embedding's weight (as `fsdp train --tie-embeddings`)")
    spec.add_args(m)
    t = p.add_argument_group("training")
    t.add_argument("--batch", type=int, default=4, help="sequences per rank")
    t.add_argument("--steps", type=int, default=100)
    t.add_argument("--warmup-steps", type=int, default=10, help="lr warm-up steps")
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--min-lr", type=float, default=3e-5)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--beta2", type=float, default=0.95,
                   help="AdamW's beta2 (fsdp train's AdamW uses 0.999: pass it for parity runs)")
    t.add_argument("--clip-grad-norm", type=float, default=1.0, help="0: no clipping (nor norm)")
    t.add_argument("--param-dtype", choices=("bf16", "fp32"), default="bf16")
    t.add_argument("--reshard-after-forward", type=int, choices=(0, 1), default=1,
                   help="reshard_after_forward of the blocks (the root keeps its default)")
    t.add_argument("--compile", action="store_true", help="torch.compile each block")
    t.add_argument("--cpu-offload", action="store_true",
                   help="FSDP2's CPUOffloadPolicy: params, grads and AdamW on the host (as --offload optimizer)")
    t.add_argument("--activation-checkpointing", choices=("none", "full"), default="none",
                   help="full: every block recomputes its forward in backward")
    t.add_argument("--fp8", choices=("none", "tensorwise"), default="none",
                   help="tensorwise: the blocks' Linears through torch._scaled_mm with the recipe of "
                        "fsdp train --fp8 tensorwise (bench/torch_float8.py; bf16 all-gather)")
    t.add_argument("--init-from", default=None, help="safetensors with Hugging Face Llama names")
    t.add_argument("--seed", type=int, default=1, help="the sampler's seed (and the init's without --init-from)")
    d = p.add_argument_group("data and output")
    d.add_argument("--data", required=True, help="train.bin (llm.c token file)")
    d.add_argument("--val-data", default=None, help="val.bin; with --eval-every")
    d.add_argument("--eval-every", type=int, default=0, help="validation loss every N steps (0: never)")
    d.add_argument("--val-batches", type=int, default=8, help="validation batches (the first ones)")
    d.add_argument("--bench-warmup", type=int, default=5, help="steps left out of the timing")
    d.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak per GPU (H200: 989)")
    d.add_argument("--log-every", type=int, default=10)
    d.add_argument("--config", default=None, help="row name in the JSON (default: derived)")
    d.add_argument("--out", default=None, help="rank 0 writes the JSON summary here")
    a = p.parse_args()
    if a.dim % a.heads or a.heads % a.kv_heads or (a.dim // a.heads) % 2:
        p.error("--dim must split into --heads heads of even size, and --heads into --kv-heads groups")
    if not 0 <= a.bench_warmup < a.steps:
        p.error(f"--bench-warmup must be in [0, steps), got {a.bench_warmup}")
    if a.warmup_steps < 0 or a.min_lr > a.lr:
        p.error("--warmup-steps must be >= 0 and --min-lr <= --lr")
    if a.eval_every and not a.val_data:
        p.error("--eval-every needs --val-data")
    if a.fp8 != "none" and a.param_dtype != "bf16":
        p.error("--fp8 needs --param-dtype bf16 (as fsdp train)")
    spec.check_args(p, a)
    return a


def main(spec=None):
    spec = spec or LlamaSpec()
    a = parse_args(spec)
    # Single process without torchrun: a world of one, still through FSDP2 and NCCL.
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")):
        os.environ.setdefault(key, value)
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    spec.setup(a, rank, world)

    try:
        train_tokens = llm_data.read_token_file(a.data, a.vocab, a.batch * world * a.seq_len + 1, "one global batch")
        sampler = llm_data.BatchSampler(len(train_tokens), a.batch, a.seq_len, world, a.seed, a.data)
        val = None
        if a.eval_every:
            val_tokens = llm_data.read_token_file(a.val_data, a.vocab, a.batch * world * a.seq_len + 1,
                                                  "one global batch")
            val = llm_data.ValidationBatches(len(val_tokens), a.batch, a.seq_len, world, a.val_batches, a.val_data)
            val_tokens = token_tensor(val_tokens)
    except llm_data.DataError as e:
        sys.exit(f"torch_llama: error: {e}")
    train_tokens = token_tensor(train_tokens)

    with torch.device("meta"):  # no CPU copy of a 1B model: storage comes on the GPU below
        model = spec.build(a)
    model.to_empty(device=device)
    if hasattr(model, "tie"):
        model.tie()
    for module in model.modules():
        if isinstance(module, Attention):
            module.reset_rope()
    params = sum(p.numel() for p in model.parameters())
    assert params == spec.expected_param_count(a), (params, spec.expected_param_count(a))
    if a.init_from:
        load_initial_weights(model, a.init_from, a, spec)
    else:
        spec.init_weights(model, a)
    if a.fp8 == "tensorwise":
        import torch_float8  # bench/torch_float8.py
        torch_float8.convert_blocks(model)
    if a.activation_checkpointing == "full":
        # Per block, as torchtitan's full AC: each block keeps its input and recomputes its
        # forward in backward (checkpoint_wrapper, applied before compile and fully_shard).
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        for i, block in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)
    if a.compile:
        for block in model.layers:
            block.compile()
    dtype = torch.bfloat16 if a.param_dtype == "bf16" else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    spec.shard(model, a, mp)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, a.beta2), eps=1e-8,
                            weight_decay=a.weight_decay, fused=True)

    def evaluate():
        model.eval()
        total = torch.zeros((), dtype=torch.float32, device=device)
        with torch.no_grad():
            for k in range(val.count):
                x, y = batch_of(val_tokens, val.rank_windows(k, rank), a.seq_len, device)
                total += spec.loss(model, x, y)
        dist.all_reduce(total)
        model.train()
        return total.item() / (val.count * world)

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step_ms, losses, norms, lrs, val_losses, peaks = [], [], [], [], [], []
    for step in range(a.steps):
        x, y = batch_of(train_tokens, sampler.rank_windows(step, rank), a.seq_len, device)
        lr = lr_at(step, a)
        for group in opt.param_groups:
            group["lr"] = lr
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = spec.loss(model, x, y)
        loss.backward()
        norm = spec.grad_norm_and_clip(model, a.clip_grad_norm) if a.clip_grad_norm > 0 else None
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        peaks.append(torch.cuda.max_memory_allocated())  # since the first step
        losses.append(loss.detach())
        norms.append(norm.detach() if norm is not None else None)
        lrs.append(lr)
        if rank == 0 and a.log_every and (step + 1) % a.log_every == 0:
            print(f"step {step + 1}/{a.steps}  loss {loss.item():.4f} (rank 0)  lr {lr:.3g}  "
                  f"{step_ms[-1]:.1f} ms", flush=True)
        if val is not None and (step + 1) % a.eval_every == 0:
            val_losses.append({"step": step + 1, "loss": evaluate()})
            if rank == 0:
                print(f"step {step + 1}: val loss {val_losses[-1]['loss']:.4f}", flush=True)

    # The mean loss over all ranks' tokens (each rank's is a mean over its B*T tokens).
    loss_t = torch.stack(losses).float()
    dist.all_reduce(loss_t)
    loss_vals = (loss_t / world).tolist()
    norm_vals = [float(n) for n in norms] if a.clip_grad_norm > 0 else None
    peak_t = torch.tensor([torch.cuda.max_memory_allocated()], dtype=torch.int64, device=device)
    dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
    peaks_t = torch.tensor(peaks, dtype=torch.int64, device=device)
    dist.all_reduce(peaks_t, op=dist.ReduceOp.MAX)
    timed = step_ms[a.bench_warmup:]
    mean_ms = statistics.fmean(timed)
    tokens_per_rank = a.batch * a.seq_len
    tokens_per_s = tokens_per_rank / (mean_ms * 1e-3)
    non_embedding, counted = spec.flops_params(a, params)
    flops_per_token = 6 * non_embedding + 12 * a.layers * a.dim * a.seq_len
    mfu = flops_per_token * tokens_per_s / (a.peak_tflops * 1e12)

    if rank == 0:
        engine = spec.engine_name + ("-compile" if a.compile else "")
        out = {
            "config": a.config or spec.config_name(a),
            "engine": engine,
            "world_size": world,
            "sequences_per_rank": a.batch,
            "seq_len": a.seq_len,
            "tokens_per_s_per_gpu": tokens_per_s,
            "mfu": mfu,
            "peak_mem_bytes": int(peak_t.item()),
            "peak_mem_bytes_by_step": peaks_t.tolist(),
            "step_ms_mean": mean_ms,
            "step_ms_median": statistics.median(timed),
            "losses": loss_vals,
            "grad_norms": norm_vals,
            "lrs": lrs,
            "val_losses": val_losses,
            "params": params,
            "non_embedding_params": non_embedding,
            "flops_per_token": flops_per_token,
            "mfu_formula": f"(6 * ({counted}) + 12 * layers * dim * seq_len) * tokens_per_s_per_gpu / peak",
            "peak_tflops": a.peak_tflops,
            "param_dtype": a.param_dtype,
            "reduce_dtype": "fp32",
            "compile": a.compile,
            "activation_checkpointing": a.activation_checkpointing,
            "fp8": a.fp8,
            "cpu_offload": a.cpu_offload,
            "steps": a.steps,
            "bench_warmup": a.bench_warmup,
            "seed": a.seed,
            "init_from": a.init_from,
            "data": a.data,
            "model": {k: getattr(a, k) for k in ("layers", "dim", "heads", "kv_heads", "ffn_dim", "seq_len", "vocab")},
            "optimizer": {"lr": a.lr, "min_lr": a.min_lr, "warmup_steps": a.warmup_steps,
                          "weight_decay": a.weight_decay, "clip_grad_norm": a.clip_grad_norm,
                          "betas": [0.9, a.beta2], "eps": 1e-8},
            "torch_version": torch.__version__,
            "gpu": torch.cuda.get_device_name(device),
        }
        out.update(spec.summary(model, a))
        print(f"done: {engine}, {world} ranks x {a.batch} x {a.seq_len}, step {mean_ms:.2f} ms (mean after "
              f"{a.bench_warmup}), {tokens_per_s:.0f} tokens/s per GPU, MFU {100 * mfu:.1f}%, peak "
              f"{out['peak_mem_bytes'] / 2**30:.2f} GiB, loss {loss_vals[0]:.4f} -> {loss_vals[-1]:.4f}", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(out, f, indent=2)
                f.write("\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
