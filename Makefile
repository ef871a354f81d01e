# make run   installs missing Debian packages, builds, and trains briefly on the best backend.
# make test  the same set-up, then the whole test suite.
BUILD ?= build
JOBS ?= $(shell nproc)
PACKAGES := cmake ninja-build g++ libopenblas-dev libcli11-dev nlohmann-json3-dev \
            libgtest-dev librapidcheck-dev zlib1g-dev
CMAKE_FLAGS ?=

.PHONY: all deps build run test clean format

all: build

deps:
	@missing=""; for p in $(PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/fsdp train --backend auto --model moe --world-size 4 --layers 4 --dim 64 \
	  --experts 4 --tokens 128 --steps 30 --rs-max-input-buffers 2 --separate-rs-group 1 \
	  --json $(BUILD)/run.json

test: build
	@if [ -x $(BUILD)/fsdp_gpu_tests ]; then \
	  $(BUILD)/fsdp_gpu_tests --gtest_list_tests >/dev/null 2>&1; \
	  if [ $$? -eq 77 ]; then echo "GPU tests SKIPPED: no CUDA GPU on this machine (scripts/gpu_check.sh runs them on one)"; fi; \
	fi
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')

clean:
	rm -rf $(BUILD)
