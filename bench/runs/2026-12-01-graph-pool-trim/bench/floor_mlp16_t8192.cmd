build-gpu/bench/gemm_floor 8192 4096 16 20
