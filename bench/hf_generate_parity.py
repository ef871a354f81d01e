#!/usr/bin/env python3
"""Greedy decoding of `fsdp generate` against transformers' `generate(do_sample=False)`, fp32.

    python3 bench/hf_generate_parity.py --fsdp build-gpu/fsdp --out /tmp/hf_generate \
        [--train-steps 200] [--backends cuda,cpu] [--new-tokens 64] [--input-ids]

For a Llama-3.2-shaped model (tied head, GQA, theta 500000, llama3 rope scaling) and a
Qwen2.5-shaped one (tied head, q/k/v biases, theta 1e6, eps 1e-6), cut small, this script:
  1. builds the model with transformers' own class (LlamaForCausalLM, Qwen2ForCausalLM) with a
     vocabulary just above the tokenizer fixture's (tests/fixtures/tokenizer/llama3_like and
     qwen2_like), and trains it for --train-steps AdamW steps on the fixture's corpus
     (tests/fixtures/tokenizer/corpus.txt) tokenized by that tokenizer, so that its
     continuations are neither noise nor one repeated token;
  2. writes it with save_pretrained (fp32 safetensors) and copies the tokenizer files beside it;
  3. for each prompt, encodes it with the `tokenizers` package (special tokens included, as
     `fsdp generate` does) and decodes --new-tokens tokens greedily with
     model.generate(do_sample=False) in fp32 (TF32 off, eager attention), with no
     end-of-sequence token so that every run makes all of them;
  4. runs `fsdp generate --init-from DIR --prompt P --max-new-tokens N --ignore-eos --json F`
     on each of --backends, and compares the prompt's ids and every new id with torch's.
Writes OUT/results.json and one line per (model, backend, prompt); exits 1 when an id differs.
"""
import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import tokenizers
import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"
SEQ, BATCH, VOCAB = 64, 8, 704  # the fixtures' tokenizers have 663 ids
PROMPTS = ["The quick brown fox", "def main():\n    ", "In the beginning"]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_parity import V5, rope  # noqa: E402  the rope keys in this transformers' spelling


def configs():
    t = transformers
    common = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
                  max_position_embeddings=4096, attention_dropout=0.0, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    llama3 = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=64)
    return {
        "llama3.2": (t.LlamaForCausalLM, t.LlamaConfig(
            **common, rms_norm_eps=1e-5, **rope(500000.0, llama3), tie_word_embeddings=True,
            attention_bias=False, mlp_bias=False), "llama3_like"),
        "qwen2.5": (t.Qwen2ForCausalLM, t.Qwen2Config(
            **common, rms_norm_eps=1e-6, **rope(1000000.0), tie_word_embeddings=True,
            use_sliding_window=False, sliding_window=4096, max_window_layers=2), "qwen2_like"),
    }


def pretrain(model, ids, steps, device):
    """AdamW on random windows of the corpus's ids."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(11)
    ids = ids.to(device)
    for _ in range(steps):
        starts = torch.randint(len(ids) - SEQ - 1, (BATCH,), generator=g).tolist()
        rows = torch.stack([ids[s:s + SEQ + 1] for s in starts])
        logits = model(input_ids=rows[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 rows[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return float(loss)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fsdp", default="build-gpu/fsdp")
    p.add_argument("--out", default="/tmp/hf_generate")
    p.add_argument("--backends", default="cuda,cpu")
    p.add_argument("--train-steps", type=int, default=200)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--input-ids", action="store_true",
                   help="give fsdp the prompt's ids (--input-ids), not its text: for a build "
                        "without a tokenizer.json reader; the decoding is compared all the same")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = (FIXTURES / "corpus.txt").read_text(encoding="utf-8")
    results = {"transformers": transformers.__version__, "torch": torch.__version__, "runs": []}
    ok = True
    for name, (cls, config, fixture) in configs().items():
        tok = tokenizers.Tokenizer.from_file(str(FIXTURES / fixture / "tokenizer.json"))
        ids = torch.tensor(tok.encode(corpus * 4, add_special_tokens=False).ids)
        torch.manual_seed(0)
        model = cls._from_config(config, attn_implementation="eager").to(device).float()
        loss = pretrain(model, ids, a.train_steps, device)
        model.eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        d = out / name
        shutil.rmtree(d, ignore_errors=True)
        kw = {} if V5 else {"safe_serialization": True}
        model.save_pretrained(str(d), **kw)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(FIXTURES / fixture / f, d / f)
        for k, prompt in enumerate(PROMPTS):
            want_prompt = tok.encode(prompt).ids  # the special tokens too, as tokenizer(text)
            input_ids = torch.tensor([want_prompt], device=device)
            with torch.no_grad():
                gen = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                     do_sample=False, max_new_tokens=a.new_tokens,
                                     eos_token_id=None, pad_token_id=0)
            want_new = gen[0, len(want_prompt):].tolist()
            for backend in a.backends.split(","):
                js = d / f"fsdp_{backend}_{k}.json"
                cmd = [a.fsdp, "generate", "--backend", backend, "--init-from", str(d),
                       *(["--input-ids", ",".join(map(str, want_prompt))] if a.input_ids
                         else ["--prompt", prompt]), "--max-new-tokens", str(a.new_tokens), "--ignore-eos",
                       "--json", str(js)]
                r = subprocess.run(cmd, capture_output=True, text=True)
                got = json.loads(js.read_text()) if r.returncode == 0 and js.exists() else {}
                same_prompt = got.get("prompt_ids") == want_prompt
                first_diff = next((i for i, (x, y) in enumerate(zip(got.get("new_ids", []), want_new))
                                   if x != y), None)
                same = same_prompt and got.get("new_ids") == want_new
                ok = ok and same
                results["runs"].append({"model": name, "backend": backend, "prompt": prompt,
                                        "train_loss": loss, "rc": r.returncode,
                                        "stderr": r.stderr[-500:], "same_prompt_ids": same_prompt,
                                        "same_new_ids": same, "first_difference": first_diff,
                                        "torch_new_ids": want_new,
                                        "fsdp_new_ids": got.get("new_ids")})
                print(f"{name} {backend} prompt {k}: {'same' if same else 'DIFFERENT'} "
                      f"({len(want_new)} new tokens, train loss {loss:.3f}"
                      f"{'' if first_diff is None else f', first difference at {first_diff}'}"
                      f"{'' if r.returncode == 0 else ', rc ' + str(r.returncode) + ': ' + r.stderr.strip()[-200:]})")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
