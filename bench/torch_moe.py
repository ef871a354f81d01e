#!/usr/bin/env python3
"""PyTorch FSDP2 reference for `fsdp train --model moe-transformer` (docs/moe.md), torchtitan's layout.

One GPU:   torchrun --standalone --nproc-per-node 1 bench/torch_moe.py --data DIR/train.bin --vocab 4096 ... --out t.json
N GPUs:    torchrun --standalone --nproc-per-node N bench/torch_moe.py ... --ep E --out t.json

bench/torch_llama.py's transformer, data, recipe, timing and summary (this file only adds the MoE
layer, its sharding and its loss), with the feed-forward of every --moe-every-th block (blocks
1, 3, 5, ... by default) replaced by an MoE layer, as ours:
  layers.{i}.moe.router.weight   [E, D]            Linear(D, E), no bias, on the dense (dp) mesh
  layers.{i}.moe.experts.w13     [E/ep, 2F, D]     rows per expert: gate, then up
  layers.{i}.moe.experts.w2      [E/ep, D, F]      the experts: fully_shard on the efsdp mesh
Routing (Note [MoE routing]): softmax over the router logits in fp32, the top K experts per token,
their probabilities renormalized to sum to 1. The auxiliary loss of a rank's tokens (its routing
group): aux_w * E * sum_e f_e * P_e, f_e = the fraction of the T * K assignments routed to e
(before drops; a constant), P_e = the mean probability of e; summed over MoE layers and added to
the cross-entropy (the logged loss includes it, as ours). --capacity-factor cf > 0 keeps at most
ceil(cf * T * K / E) assignments per expert, first in assignment order (token, then k); the
others are dropped (that expert adds nothing; the weights are not renormalized). Experts are
SwiGLU: w2(silu(x w1^T) * (x w3^T)), the product in fp32. The combine adds w * expert(x) over
a token's kept assignments in fp32.
Dispatch (torchtitan's expert parallelism): the kept assignments sorted by expert, the per-expert
counts exchanged by all-to-all over the ep group (and read on the host), the rows moved by an
autograd all-to-all (torch.distributed._functional_collectives.all_to_all_single_autograd),
permuted expert-major with every expert's rows padded to a multiple of 16, the local experts run
as torch._grouped_mm (bf16; a loop of matmuls otherwise), and the same way back. With ep 1 there
is no all-to-all.
Meshes (torchtitan): dp = every rank; ep groups of consecutive ranks (ep rank = rank % ep); the
experts of ep rank p (global experts [p E/ep, (p + 1) E/ep)) fully_shard over the efsdp mesh of
the ranks with the same ep rank, with gradient divide factor dp (their grad already sums the ep
group's tokens); every other param fully_shards over dp. Clipping: the global norm over both
meshes (the experts' squared norm summed over the ep group too).
Weights: --init-from the file that `fsdp export --init --model moe-transformer ...` (or export of
a checkpoint) writes: Llama names for the dense params, fqns for the MoE layer's, every expert
(this rank takes its ep block).
MFU: flops per token = 6 N_active + 12 L D T, N_active = the non-embedding params with K of the
E experts of each MoE layer counted (ours: nn::flops_per_token).
"""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_llama as base  # noqa: E402  (bench/torch_llama.py)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    from torch.distributed.device_mesh import init_device_mesh
except ImportError:
    from torch.distributed._tensor.device_mesh import init_device_mesh
from torch.distributed._functional_collectives import all_to_all_single_autograd  # noqa: E402

GROUP_ALIGN = 16  # rows per expert padded to this (torchtitan pads token groups for grouped GEMMs)


def is_moe_layer(i, every):
    return (i + 1) % every == 0


class GroupedExperts(nn.Module):
    def __init__(self, local_experts, dim, ffn):
        super().__init__()
        self.ffn = ffn
        self.w13 = nn.Parameter(torch.empty(local_experts, 2 * ffn, dim))  # rows: gate, then up
        self.w2 = nn.Parameter(torch.empty(local_experts, dim, ffn))
        self.use_grouped_mm = False  # set by check_grouped_mm()

    def forward(self, x, counts):
        """x: rows expert-major, counts[l] rows for local expert l (each a multiple of GROUP_ALIGN)."""
        if self.use_grouped_mm and x.dtype == torch.bfloat16:
            offs = torch.tensor(counts, device=x.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            h = torch._grouped_mm(x, self.w13.transpose(-2, -1), offs=offs)
            gate, up = h.split([self.ffn, self.ffn], dim=-1)
            act = (F.silu(gate.float()) * up.float()).to(x.dtype)
            return torch._grouped_mm(act, self.w2.transpose(-2, -1), offs=offs)
        outs, at = [], 0
        for l, n in enumerate(counts):
            xl = x[at:at + n]
            gate, up = (xl @ self.w13[l].t()).split([self.ffn, self.ffn], dim=-1)
            outs.append(((F.silu(gate.float()) * up.float()).to(x.dtype)) @ self.w2[l].t())
            at += n
        return torch.cat(outs) if outs else x.new_zeros(0, self.w2.shape[1])


class MoE(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.experts_total, self.top_k, self.ep = a.experts, a.top_k, a.ep
        self.local = a.experts // a.ep
        self.capacity_factor, self.aux_weight = a.capacity_factor, a.aux_loss_weight
        self.router = nn.Linear(a.dim, a.experts, bias=False)
        self.experts = GroupedExperts(self.local, a.dim, a.expert_ffn_dim)
        self.ep_group = None  # set by MoeSpec.setup through the model
        self.aux_loss = None

    def forward(self, x):
        b, t, d = x.shape
        xf = x.reshape(b * t, d)
        n, E, K = xf.shape[0], self.experts_total, self.top_k
        probs = torch.softmax(self.router(xf).float(), dim=-1)  # [n, E] fp32
        top_p, top_e = probs.topk(K, dim=-1)
        weights = top_p / top_p.sum(dim=-1, keepdim=True)
        flat_e = top_e.flatten()  # assignment a = token * K + k
        routed = torch.bincount(flat_e, minlength=E).float()
        self.aux_loss = self.aux_weight * E * (routed / (n * K) * probs.mean(dim=0)).sum()
        if self.capacity_factor > 0:
            capacity = math.ceil(self.capacity_factor * n * K / E)
            onehot = F.one_hot(flat_e, E)
            place = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) - 1  # earlier assignments to e
            kept = torch.nonzero(place < capacity).flatten()
        else:
            kept = torch.arange(n * K, device=x.device)
        order = torch.argsort(flat_e[kept], stable=True)
        assignment = kept[order]  # sorted by expert, then by assignment
        token = assignment // K
        w = weights.flatten()[assignment]
        counts = torch.bincount(flat_e[assignment], minlength=E)  # [E] per destination expert
        rows = xf[token]

        if self.ep > 1:
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.ep_group)
            send_counts, recv_host = counts.view(self.ep, self.local).sum(1).tolist(), \
                recv_counts.view(self.ep, self.local).tolist()
            recv_splits = [sum(r) for r in recv_host]
            rows = all_to_all_single_autograd(rows, recv_splits, send_counts, self.ep_group)
        else:
            recv_host = [counts.tolist()]
        # Peer-major [source][local expert] -> expert-major ([local expert][source]), each expert's
        # rows padded to GROUP_ALIGN: dest[i] is received row i's place (index math on the host).
        c = torch.tensor(recv_host, dtype=torch.long)  # [sources, local experts]
        padded = (c.sum(0) + GROUP_ALIGN - 1) // GROUP_ALIGN * GROUP_ALIGN
        dest_block = ((padded.cumsum(0) - padded)[None, :] + (c.cumsum(0) - c)).flatten()
        flat = c.flatten()
        src_block = flat.cumsum(0) - flat
        block_of_row = torch.repeat_interleave(torch.arange(flat.numel()), flat)
        dest = dest_block[block_of_row] + torch.arange(block_of_row.numel()) - src_block[block_of_row]
        dest = dest.to(x.device, non_blocking=True)
        expert_in = rows.new_zeros(int(padded.sum()), d).index_copy(0, dest, rows)
        expert_out = self.experts(expert_in, padded.tolist())[dest]
        if self.ep > 1:
            expert_out = all_to_all_single_autograd(expert_out, send_counts, recv_splits, self.ep_group)
        y = torch.zeros(n, d, dtype=torch.float32, device=x.device)
        y = y.index_add(0, token, expert_out.float() * w[:, None])
        return y.to(x.dtype).view(b, t, d)


class MoeBlock(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.attention_norm = base.RMSNorm(a.dim)
        self.attention = base.Attention(a.dim, a.heads, a.kv_heads, a.seq_len, a.rope_theta)
        self.ffn_norm = base.RMSNorm(a.dim)
        self.moe = MoE(a)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.moe(self.ffn_norm(h))


class MoeTransformer(base.Transformer):
    def __init__(self, a):
        super().__init__(a)  # dense blocks; the MoE ones replaced below
        for i in range(a.layers):
            if is_moe_layer(i, a.moe_every):
                self.layers[i] = MoeBlock(a)

    def moe_layers(self):
        return [layer.moe for layer in self.layers if isinstance(layer, MoeBlock)]


def check_grouped_mm(device):
    """torch._grouped_mm where this PyTorch has it and it agrees with the loop (bf16, empty and
    padded groups, forward and backward); the summary says which ran."""
    if not hasattr(torch, "_grouped_mm"):
        return False, "no torch._grouped_mm"
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        ex = GroupedExperts(3, 64, 32).to(device)
        with torch.no_grad():
            ex.w13.normal_(0, 0.1, generator=gen)
            ex.w2.normal_(0, 0.1, generator=gen)
        ex = ex.to(torch.bfloat16)
        x = torch.randn(48, 64, device=device, generator=gen).to(torch.bfloat16)
        counts = [32, 0, 16]
        results = []
        for grouped in (False, True):
            ex.use_grouped_mm = grouped
            xi = x.clone().requires_grad_(True)
            ex.zero_grad(set_to_none=True)
            y = ex(xi, counts)
            y.float().square().sum().backward()
            results.append([y.float(), xi.grad.float(), ex.w13.grad.float(), ex.w2.grad.float()])
        for r, g in zip(*results):
            if not torch.allclose(r, g, rtol=2e-2, atol=2e-2):
                return False, f"torch._grouped_mm disagrees with the loop (max diff {(r - g).abs().max().item():.3g})"
        return True, "torch._grouped_mm"
    except Exception as e:  # noqa: BLE001  (an unsupported GPU or dtype: the loop runs, and the summary says why)
        return False, f"torch._grouped_mm failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"


class MoeSpec(base.LlamaSpec):
    description = __doc__
    engine_name = "torch-fsdp2"

    def add_args(self, m):
        m.add_argument("--experts", type=int, default=8)
        m.add_argument("--top-k", type=int, default=2)
        m.add_argument("--expert-ffn-dim", type=int, default=1408)
        m.add_argument("--capacity-factor", type=float, default=0.0, help="0: dropless")
        m.add_argument("--aux-loss-weight", type=float, default=0.01)
        m.add_argument("--moe-every", type=int, default=2)
        m.add_argument("--ep", type=int, default=1, help="expert-parallel ranks (divides the world)")

    def check_args(self, p, a):
        if a.experts < 1 or not 1 <= a.top_k <= a.experts or a.expert_ffn_dim < 1 or a.moe_every < 1:
            p.error("--experts >= 1, --top-k in [1, experts], --expert-ffn-dim >= 1, --moe-every >= 1")
        if a.ep < 1 or a.experts % a.ep:
            p.error(f"--ep must divide --experts ({a.experts}), got {a.ep}")
        if a.capacity_factor < 0 or a.aux_loss_weight < 0:
            p.error("--capacity-factor and --aux-loss-weight must be >= 0")

    def setup(self, a, rank, world):
        if world % a.ep:
            sys.exit(f"torch_moe: --ep {a.ep} does not divide the world of {world}")
        self.rank, self.world = rank, world
        self.ep_rank = rank % a.ep
        self.dp_mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("dp",))
        # [efsdp][ep]: rank = efsdp rank * ep + ep rank, so ep groups are consecutive ranks.
        mesh2 = init_device_mesh("cuda", (world // a.ep, a.ep), mesh_dim_names=("efsdp", "ep"))
        self.efsdp_mesh, self.ep_mesh = mesh2["efsdp"], mesh2["ep"]
        self.ep_group = self.ep_mesh.get_group() if a.ep > 1 else None
        self.grouped_mm, self.grouped_mm_note = check_grouped_mm(torch.device("cuda", torch.cuda.current_device()))

    def build(self, a):
        model = MoeTransformer(a)
        for moe in model.moe_layers():
            moe.ep_group = self.ep_group
            moe.experts.use_grouped_mm = self.grouped_mm
        return model

    def _counts(self, a):
        """(params on this rank, active non-embedding params): attention, norms, dense FFNs, routers,
        experts (E / ep here; K of E active), embedding and head."""
        d, hd = a.dim, a.dim // a.heads
        attention = d * (a.heads + 2 * a.kv_heads) * hd + a.heads * hd * d + 2 * d
        local = 2 * a.vocab * d + d
        active = a.vocab * d + d
        for i in range(a.layers):
            if is_moe_layer(i, a.moe_every):
                local += attention + a.experts * d + (a.experts // a.ep) * 3 * d * a.expert_ffn_dim
                active += attention + a.experts * d + a.top_k * 3 * d * a.expert_ffn_dim
            else:
                local += attention + 3 * d * a.ffn_dim
                active += attention + 3 * d * a.ffn_dim
        return local, active

    def expected_param_count(self, a):
        return self._counts(a)[0]

    def hf_to_engine(self, hf, a):
        lo, hi = self.ep_rank * (a.experts // a.ep), (self.ep_rank + 1) * (a.experts // a.ep)

        def ffn(i, take, sd):
            if not is_moe_layer(i, a.moe_every):
                return base.dense_ffn_from_hf(i, take, sd)
            p = f"layers.{i}.moe."
            sd[p + "router.weight"] = take(p + "router.weight")
            for w in ("w13", "w2"):
                full = take(p + "experts." + w)
                if full.shape[0] != a.experts:
                    sys.exit(f"--init-from: {p}experts.{w} holds {full.shape[0]} experts, not {a.experts}")
                sd[p + "experts." + w] = full[lo:hi].contiguous()
        return base.hf_to_engine(hf, a, ffn)

    def init_weights(self, model, a):
        base.init_weights(model, a.seed)  # N(0, 0.02) everywhere, unit norms (no parity without --init-from)

    def shard(self, model, a, mp):
        raf = bool(a.reshard_after_forward)
        extra = base.offload_policy(a)
        for block in model.layers:
            if isinstance(block, MoeBlock):
                experts = base.fully_shard(block.moe.experts, mesh=self.efsdp_mesh, mp_policy=mp,
                                           reshard_after_forward=raf, **extra)
                # torchtitan: the experts' grads sum their ep group's tokens already; the grad of
                # the mean loss over dp ranks divides the efsdp sum by dp.
                if a.ep > 1:  # with ep 1 the efsdp mesh is dp: the default average is this
                    experts.set_gradient_divide_factor(float(self.world))
            base.fully_shard(block, mesh=self.dp_mesh, mp_policy=mp, reshard_after_forward=raf, **extra)
        base.fully_shard(model, mesh=self.dp_mesh, mp_policy=mp, **extra)

    def loss(self, model, inputs, labels):
        ce = base.loss_of(model, inputs, labels)
        return ce + sum(moe.aux_loss for moe in model.moe_layers())

    def grad_norm_and_clip(self, model, max_norm):
        experts = [p for n, p in model.named_parameters() if ".moe.experts." in n]
        dense = [p for n, p in model.named_parameters() if ".moe.experts." not in n]
        return base.grad_norm_and_clip(model, max_norm, [(dense, None), (experts, self.ep_group)])

    def flops_params(self, a, params):
        return self._counts(a)[1], "active non-embedding params (K of E experts per MoE layer)"

    def config_name(self, a):
        return "moe-llama"

    def summary(self, model, a):
        local, active = self._counts(a)
        return {"ep": a.ep, "experts": a.experts, "top_k": a.top_k, "expert_ffn_dim": a.expert_ffn_dim,
                "capacity_factor": a.capacity_factor, "aux_loss_weight": a.aux_loss_weight,
                "moe_every": a.moe_every, "active_params": active + a.vocab * a.dim,
                "expert_gemm": self.grouped_mm_note,
                "layout": f"dp {self.world} (dense), ep {a.ep} x efsdp {self.world // a.ep} (experts)"}


if __name__ == "__main__":
    base.main(MoeSpec())
