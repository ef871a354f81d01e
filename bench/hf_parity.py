#!/usr/bin/env python3
"""Parity of `fsdp train --init-from DIR` with Hugging Face's own model classes, fp32, on a GPU.

    python3 bench/hf_parity.py --fsdp build-gpu/fsdp --out /tmp/hf_parity [--train-steps 200]

For configs shaped like Llama-3.2-1B (tied head, llama3 rope scaling, theta 500000),
Llama-3.1-8B (untied, llama3 scaling factor 8), Qwen2.5-0.5B (tied, q/k/v biases, theta 1e6,
eps 1e-6), Mistral-7B-v0.3 (untied, theta 1e6, no window) and a Mistral-Nemo-like head width
(head_dim 64 with dim / heads = 32), cut in width and depth but with every key that changes
the math, this script:
  1. builds the model with transformers' own class (LlamaForCausalLM, Qwen2ForCausalLM,
     MistralForCausalLM) and trains it for --train-steps AdamW steps in torch on a token file
     with a learnable rule, so that the weights are not random (random weights hide rope
     errors: the attention is then nearly uniform);
  2. writes it with save_pretrained (safetensors; the Qwen2 and Mistral models in shards of
     --max-shard-size, with model.safetensors.index.json);
  3. computes, in torch fp32 (TF32 off, eager attention), the mean next-token cross-entropy of
     the first training batch and of the first --eval-batches validation batches that
     `fsdp train --data` reads (bench/llm_data.py, the engine's sampler bit for bit);
  4. runs `fsdp train --init-from DIR --data ... --steps 1 --lr 1e-30 --param-dtype fp32` (an lr
     too small to move an fp32 weight: the validation loss after step 1 is the loaded model's)
     and compares its loss_first and validation loss with torch's: |ours - torch| <= 1e-5 |torch|;
  5. where the build has `fsdp export --hf`, also exports the loaded checkpoint and loads it
     back with AutoModelForCausalLM.from_pretrained, which must report no missing or
     unexpected keys and give torch's losses again.
Writes OUT/results.json and one line per model; exits 1 when a comparison fails.
"""
import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm_data  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402

SEQ, BATCH, VOCAB = 128, 4, 2048
REL = 1e-5


V5 = int(transformers.__version__.split(".")[0]) >= 5


def rope(theta, scaling=None):
    """The rope keys in this transformers' spelling: rope_parameters (5) or rope_theta and
    rope_scaling (4)."""
    if V5:
        return {"rope_parameters": {"rope_type": "default", "rope_theta": theta, **(scaling or {})}}
    return {"rope_theta": theta, **({"rope_scaling": scaling} if scaling else {})}


def configs():
    t = transformers
    common = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=2, hidden_act="silu",
                  max_position_embeddings=131072, attention_dropout=0.0)
    llama3 = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192)
    return {
        # Llama-3.2-1B's keys: tied, theta 500000, llama3 scaling factor 32, eps 1e-5. A short
        # original context (64) puts some of the 32-wide heads' frequencies in each band.
        "llama3.2": (t.LlamaForCausalLM, t.LlamaConfig(
            **{**common, "num_attention_heads": 4}, rms_norm_eps=1e-5,
            **rope(500000.0, {**llama3, "original_max_position_embeddings": 64}),
            tie_word_embeddings=True, attention_bias=False, mlp_bias=False, head_dim=64), None),
        # Llama-3.1-8B's: untied, llama3 factor 8.
        "llama3.1": (t.LlamaForCausalLM, t.LlamaConfig(
            **common, rms_norm_eps=1e-5,
            **rope(500000.0, {**llama3, "factor": 8.0, "original_max_position_embeddings": 64}),
            tie_word_embeddings=False), None),
        # Qwen2.5-0.5B's: tied, biases (always, in Qwen2), theta 1e6, eps 1e-6, no window.
        "qwen2.5": (t.Qwen2ForCausalLM, t.Qwen2Config(
            **common, rms_norm_eps=1e-6, **rope(1000000.0), tie_word_embeddings=True,
            use_sliding_window=False, sliding_window=32768, max_window_layers=3), "200KB"),
        # Mistral-7B-v0.3's: untied, theta 1e6, sliding_window null.
        "mistral": (t.MistralForCausalLM, t.MistralConfig(
            **common, rms_norm_eps=1e-5, **rope(1000000.0), sliding_window=None,
            tie_word_embeddings=False), "300KB"),
        # Mistral-Nemo's shape of head: head_dim 64 where hidden / heads is 32.
        "mistral-nemo": (t.MistralForCausalLM, t.MistralConfig(
            **common, head_dim=64, rms_norm_eps=1e-5, **rope(1000000.0), sliding_window=None,
            tie_word_embeddings=False), None),
    }


def write_data(root):
    """train.bin / val.bin with a rule to learn (3 in 4 tokens follow from the previous)."""
    g = torch.Generator().manual_seed(7)
    def tokens(n):
        out = [int(torch.randint(VOCAB, (1,), generator=g))]
        r = torch.rand(n, generator=g)
        rnd = torch.randint(VOCAB, (n,), generator=g)
        for i in range(1, n):
            out.append((out[-1] * 5 + 3) % VOCAB if r[i] < 0.75 else int(rnd[i]))
        return out
    root.mkdir(parents=True, exist_ok=True)
    train, val = tokens(200 * SEQ * BATCH + 1), tokens(8 * SEQ * BATCH + 1)
    llm_data.write_token_file(str(root / "train.bin"), train)
    llm_data.write_token_file(str(root / "val.bin"), val)
    meta = {"vocab": VOCAB, "train_tokens": len(train), "val_tokens": len(val),
            "unigram_entropy_nats": math.log(VOCAB), "unigram_entropy_bits": math.log2(VOCAB),
            "val_unigram_cross_entropy_nats": math.log(VOCAB), "token_dtype": "uint16",
            "tokenizer": "none"}
    (root / "meta.json").write_text(json.dumps(meta))
    return torch.tensor(train), torch.tensor(val)


def batch(tokens, windows, device):
    rows = torch.stack([tokens[w * SEQ:w * SEQ + SEQ + 1] for w in windows]).to(device)
    return rows[:, :-1], rows[:, 1:]


def loss_of(model, x, y):
    logits = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def torch_losses(model, train, val, seed, eval_batches, device):
    sampler = llm_data.BatchSampler(len(train), BATCH, SEQ, 1, seed)
    vb = llm_data.ValidationBatches(len(val), BATCH, SEQ, 1, eval_batches)
    with torch.no_grad():
        first = float(loss_of(model, *batch(train, sampler.rank_windows(0, 0), device)))
        vals = [float(loss_of(model, *batch(val, vb.rank_windows(k, 0), device)))
                for k in range(vb.count)]
    return first, sum(vals) / len(vals)


def pretrain(model, train, steps, device):
    """AdamW on random windows of the training file, so that rope matters."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(11)
    windows = llm_data.window_count(len(train), SEQ)
    for _ in range(steps):
        w = torch.randint(windows, (BATCH,), generator=g).tolist()
        loss = loss_of(model, *batch(train, w, device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss)


def run(cmd, log):
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode


def close(a, b):
    return a is not None and b is not None and abs(a - b) <= REL * abs(b)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fsdp", default="build-gpu/fsdp")
    p.add_argument("--out", default="/tmp/hf_parity")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--train-steps", type=int, default=200)
    p.add_argument("--eval-batches", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--only", default="", help="comma-separated model names")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if a.backend == "cuda" else "cpu"
    out = Path(a.out)
    train, val = write_data(out / "data")
    help_text = subprocess.run([a.fsdp, "export", "--help"], capture_output=True, text=True).stdout
    can_export_hf = "--hf" in help_text
    results, ok = {"transformers": transformers.__version__, "torch": torch.__version__}, True
    for name, (cls, config, shard) in configs().items():
        if a.only and name not in a.only.split(","):
            continue
        torch.manual_seed(0)
        model = cls._from_config(config, attn_implementation="eager").to(device).float()
        trained_loss = pretrain(model, train, a.train_steps, device)
        model.eval()
        d = out / name
        kw = {"max_shard_size": shard} if shard else {}
        if not V5:  # transformers 5 writes safetensors only, and has no such argument
            kw["safe_serialization"] = True
        model.save_pretrained(str(d / "hf"), **kw)
        want_first, want_val = torch_losses(model, train, val, a.seed, a.eval_batches, device)
        js = d / "fsdp.json"
        cmd = [a.fsdp, "train", "--backend", a.backend, "--init-from", str(d / "hf"),
               "--data", str(out / "data"), "--seq-len", str(SEQ), "--tokens", str(SEQ * BATCH),
               "--steps", "1", "--eval-every", "1", "--eval-batches", str(a.eval_batches),
               "--lr", "1e-30", "--weight-decay", "0", "--clip-grad-norm", "0",
               "--warmup-steps", "0", "--param-dtype", "fp32", "--seed", str(a.seed),
               "--save-dir", str(d / "ckpt"), "--json", str(js), "--quiet"]
        cmd += ["--nproc", "1"] if a.backend == "cuda" else ["--world-size", "1"]
        rc = run(cmd, d / "fsdp.log")
        got = json.loads(js.read_text()) if rc == 0 and js.exists() else {}
        got_first = got.get("loss_first")
        got_val = got["val_losses"][0]["loss"] if got.get("val_losses") else None
        r = {"pretrained_loss": trained_loss, "torch_first": want_first, "fsdp_first": got_first,
             "torch_val": want_val, "fsdp_val": got_val, "fsdp_rc": rc,
             "shards": len(list((d / "hf").glob("*.safetensors")))}
        r["ok"] = close(got_first, want_first) and close(got_val, want_val)
        if can_export_hf and rc == 0:
            exported = d / "exported"
            erc = run([a.fsdp, "export", "--checkpoint", str(d / "ckpt"), "--hf", str(exported),
                       "--dtype", "fp32"], d / "export.log")
            r["export_rc"] = erc
            if erc == 0:
                back, info = transformers.AutoModelForCausalLM.from_pretrained(
                    str(exported), output_loading_info=True, attn_implementation="eager",
                    **({"dtype": torch.float32} if V5 else {"torch_dtype": torch.float32}))
                back = back.to(device).eval()
                r["export_missing"] = sorted(info["missing_keys"])
                r["export_unexpected"] = sorted(info["unexpected_keys"])
                r["export_first"], r["export_val"] = torch_losses(back, train, val, a.seed,
                                                                  a.eval_batches, device)
                r["ok"] = (r["ok"] and not r["export_missing"] and not r["export_unexpected"]
                           and close(r["export_first"], want_first) and close(r["export_val"], want_val))
            else:
                r["ok"] = False
        if not r["ok"]:  # what went wrong, from the logs
            for log in ("fsdp.log", "export.log"):
                if (d / log).exists():
                    print(f"  {log}: " + " | ".join((d / log).read_text().splitlines()[-3:]))
        ok = ok and r["ok"]
        results[name] = r
        rel = (abs(got_first - want_first) / abs(want_first)) if got_first is not None else float("nan")
        print(f"{name:13s} {'ok  ' if r['ok'] else 'FAIL'} first loss torch {want_first:.7f} "
              f"fsdp {got_first} (rel {rel:.2e}), val torch {want_val:.7f} fsdp {got_val}"
              + (f", export {r.get('export_first')}" if "export_rc" in r else ""), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
