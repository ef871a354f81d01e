"""The llama1b GEMM shapes of bench/gemm_floor.cpp's `llama` mode, run through PyTorch (cuBLAS)
on the same GPU: one JSON line per GEMM and a last line with the step's GEMM time, so the two
libraries' algorithm choices can be compared shape by shape.
Usage: python3 bench/torch_gemm_llama.py [tokens=8192] [reps=20]"""
import json
import sys

import torch


def ms_per_call(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / reps)
    return sorted(times)[len(times) // 2]


def main():
    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    layers = 22
    linears = [("wqkv", 2048, 2560, layers), ("wo", 2048, 2048, layers), ("w13", 2048, 11264, layers),
               ("w2", 5632, 2048, layers), ("output", 2048, 32000, 1)]
    step_ms = step_flops = 0.0
    for name, n_in, n_out, count in linears:
        x = torch.randn(tokens, n_in, device="cuda", dtype=torch.bfloat16) * 0.05
        w = torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) * 0.05
        dy = torch.randn(tokens, n_out, device="cuda", dtype=torch.bfloat16) * 0.05
        flops = 2.0 * tokens * n_in * n_out
        ops = [("fwd", lambda: x @ w.t()), ("dX", lambda: dy @ w), ("dW", lambda: dy.t() @ x)]
        for what, fn in ops:
            ms = ms_per_call(fn, reps)
            step_ms += ms * count
            step_flops += flops * count
            print(json.dumps({"gemm": f"{name} {what}", "tokens": tokens, "in": n_in, "out": n_out,
                              "ms": round(ms, 4), "tflops": round(flops / (ms * 1e-3) / 1e12, 1)}))
    print(json.dumps({"gemm": "llama1b step (22 layers + head)", "tokens": tokens,
                      "ms": round(step_ms, 3), "tflops": round(step_flops / (step_ms * 1e-3) / 1e12, 1),
                      "library": "torch " + torch.__version__}))


if __name__ == "__main__":
    main()
