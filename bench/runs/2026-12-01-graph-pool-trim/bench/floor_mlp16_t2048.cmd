build-gpu/bench/gemm_floor 2048 4096 16 20
