# make run   sets up what is missing, builds, trains briefly on the best backend and prints a
#            short sample of text from the trained model (fsdp generate)
#            (one process per GPU where there are GPUs; its first line says what it chose).
# make test  the same set-up, then the whole test suite; where there are GPUs, also the GPU
#            tests and the CUDA-vs-CPU parity checks of scripts/gpu_check.sh.
# Set-up is scripts/setup.sh: it checks capabilities (tools on PATH, libraries CMake finds)
# and installs only what is missing, with apt-get where it can.
# make sanitize  the CPU tests under ASan+UBSan (scripts/sanitize.sh, build in build-asan);
#            make test runs it too.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
SETUP_FLAGS ?=
GENERATOR := $(if $(shell command -v ninja 2>/dev/null),Ninja,Unix Makefiles)
# nvcc where NVIDIA puts it, when it is not on PATH (scripts/setup.sh looks there too).
ifeq ($(shell command -v nvcc 2>/dev/null),)
  ifneq ($(wildcard /usr/local/cuda/bin/nvcc),)
    export CUDACXX ?= /usr/local/cuda/bin/nvcc
  endif
endif
# Where nvidia-smi lists GPUs: set-up also needs nvcc and NCCL, and the build must have CUDA.
GPU_SETUP := $(shell scripts/run.sh --setup-flags)
CUDA_CMAKE := $(if $(GPU_SETUP),-DFSDP_CUDA=ON)

.PHONY: all setup build run test sanitize clean format

all: build

setup:
	@scripts/setup.sh $(GPU_SETUP) $(SETUP_FLAGS)

build: setup
	@mkdir -p $(BUILD)
	@if [ -f $(BUILD)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD) $(CUDA_CMAKE) $(CMAKE_FLAGS) >$(BUILD)/configure.log 2>&1; \
	else \
	  cmake -S . -B $(BUILD) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Release $(CUDA_CMAKE) \
	    $(CMAKE_FLAGS) >$(BUILD)/configure.log 2>&1; \
	fi || { cat $(BUILD)/configure.log; exit 1; }
	@grep -h "^CMake Warning" -A2 $(BUILD)/configure.log | grep "fsdp:" || true
	@cmake --build $(BUILD) -j $(JOBS)

run:
	@scripts/run.sh --plan
	@$(MAKE) --no-print-directory build SETUP_FLAGS="--run $(SETUP_FLAGS)"
	@scripts/run.sh $(BUILD)

test: build
	@scripts/run_tests.sh $(BUILD) $(JOBS)

sanitize: setup
	@JOBS=$(JOBS) scripts/sanitize.sh

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD) build-asan
