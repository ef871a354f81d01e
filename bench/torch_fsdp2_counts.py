#!/usr/bin/env python3
"""FSDP2's own all-gather counts for the cases that tests/test_root_reshard.cpp asserts,
measured with PyTorch's FSDP2 on 2 CPU ranks (gloo; no GPU needed):

  torchrun --standalone --nproc_per_node=2 bench/torch_fsdp2_counts.py

Rank 0 prints one line per case: FSDP2's all-gathers in one training step, and the count the
engine's test asserts. The exit status is 1 when one differs.
"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

try:  # PyTorch >= 2.6
    from torch.distributed.fsdp import FSDPModule, fully_shard
except ImportError:
    from torch.distributed._composable.fsdp import FSDPModule, fully_shard


MESH = None  # a CPU mesh over every rank (the default mesh would be on the GPUs, if any)


class Block(nn.Module):  # the test's block: Linear(D, D, bias=False) + ReLU
    def __init__(self, dim):
        super().__init__()
        self.lin = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return torch.relu(self.lin(x))


class TransformerBlock(nn.Module):  # pre-norm attention and MLP, as in FSDP2's test models
    def __init__(self, dim, heads):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, bias=False, batch_first=True)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.attention_norm(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):  # the root holds the embeddings, the final norm and the head
    def __init__(self, layers, vocab, seq_len, dim, heads):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.pos_embeddings = nn.Embedding(seq_len, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def all_gathers(step):
    """Counts FSDP2's all-gather launches in step() by wrapping torch.distributed's
    all_gather_into_tensor, which FSDP2's collectives call at run time. (CommDebugMode's module
    tracker fails on these models in PyTorch 2.11: IndexError in _fw_set_module_hook.)"""
    calls = [0]
    original = dist.all_gather_into_tensor

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    dist.all_gather_into_tensor = counted
    try:
        step()
    finally:
        dist.all_gather_into_tensor = original
    return calls[0]


def train_step(model, make_input, micro_batches):
    def step():
        for mb in range(micro_batches):
            model.set_requires_gradient_sync(mb == micro_batches - 1)
            model(make_input()).sum().backward()
    return step


def root_linear_chain(root_option, before_first_step=None):
    """FSDP2's test_gradient_accumulation: Sequential(Linear, 3 blocks), 3 micro-batches."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Block(8), Block(8), Block(8))
    for block in model[1:]:
        fully_shard(block, mesh=MESH, reshard_after_forward=True)
    fully_shard(model, mesh=MESH, **({} if root_option is None else {"reshard_after_forward": root_option}))
    step = train_step(model, lambda: torch.randn(2, 8), 3)
    step()  # the first step initializes FSDP
    return all_gathers(step)


def transformer(layers, micro_batches):
    """The blocks with FSDP2's default, the root (embeddings, norm, head) with its default."""
    torch.manual_seed(0)
    model = Transformer(layers, vocab=64, seq_len=8, dim=16, heads=2)
    for m in model.modules():
        if isinstance(m, TransformerBlock):
            fully_shard(m, mesh=MESH)
    fully_shard(model, mesh=MESH)
    step = train_step(model, lambda: torch.randint(0, 64, (2, 8)), micro_batches)
    step()
    return all_gathers(step)


def unshard_before_forward(explicit):
    """FSDP2's test_1f1b_microbatching: reshard_after_forward=False everywhere; with
    `explicit`, every module's unshard(async_op=True) before the first forward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Block(8), Block(8), Block(8))
    for block in model[1:]:
        fully_shard(block, mesh=MESH, reshard_after_forward=False)
    fully_shard(model, mesh=MESH, reshard_after_forward=False)
    step = train_step(model, lambda: torch.randn(2, 8), 3)

    def first_step():
        if explicit:
            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.unshard(async_op=True)
        step()
    return all_gathers(first_step)


def main():
    global MESH
    dist.init_process_group("gloo")
    MESH = init_device_mesh("cpu", (dist.get_world_size(),))
    cases = [
        ("root linear chain, 3 micro-batches, root unset", root_linear_chain(None), 21),
        ("root linear chain, 3 micro-batches, root False", root_linear_chain(False), 21),
        ("root linear chain, 3 micro-batches, root True", root_linear_chain(True), 24),
        ("transformer, 2 layers, 1 micro-batch", transformer(2, 1), 5),
        ("transformer, 2 layers, 4 micro-batches", transformer(2, 4), 20),
        ("transformer, 16 layers, 1 micro-batch", transformer(16, 1), 33),
        ("first step, no explicit unshard", unshard_before_forward(False), 12),
        ("first step, unshard(async_op=True) of every module first", unshard_before_forward(True), 12),
    ]
    bad = 0
    if dist.get_rank() == 0:
        print(f"torch {torch.__version__}, world {dist.get_world_size()}")
        for name, fsdp2, ours in cases:
            bad += fsdp2 != ours
            print(f"{name}: FSDP2 {fsdp2}, the engine's test {ours}{'' if fsdp2 == ours else '  <-- differs'}")
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
