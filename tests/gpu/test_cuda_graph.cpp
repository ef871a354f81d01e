// Whole-step CUDA graphs (Note [Captured steps], Note [CUDA graph capture]): the Device capture
// interface on its own, then `fsdp train --cuda-graph` against eager runs of the same flags,
// which must give bitwise-identical losses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../command_util.h"
#include "cuda_test_util.h"
#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"

namespace fsdp {
namespace {

class CudaGraphDevice : public cuda_test::CudaTwoStreamTest {
 protected:
  float read(const float* p) {
    float v = 0;
    device->copy_to_host(s, &v, p, sizeof(float));
    device->synchronize_stream(s);
    return v;
  }
};

// A side stream forks from the capture and joins back; the graph's transient buffer is graph
// memory; the host bytes are snapshotted at capture time.
TEST_F(CudaGraphDevice, ReplaysForkJoinWorkWithGraphMemory) {
  auto* acc = static_cast<float*>(device->alloc(sizeof(float), s, MemTag::Other));
  device->fill(s, acc, DType::F32, 1, 0.0f);
  const Event fork = device->create_event(), join = device->create_event();
  device->record_event(fork, s);  // recorded before the capture: its wait is dropped
  device->begin_capture(s);
  ASSERT_TRUE(device->capturing());
  device->wait_event(side, fork);  // a stale event: no join, no error
  device->record_event(fork, s);
  device->wait_event(side, fork);
  auto* tmp = static_cast<float*>(device->alloc(sizeof(float), side, MemTag::Activation));
  const float two = 2.0f;
  device->copy_from_host(side, tmp, &two, sizeof(float));
  device->record_event(join, side);
  device->wait_event(s, join);
  device->accumulate(s, acc, tmp, DType::F32, 1, 1.0f);
  device->free(tmp, s);
  const int graph = device->end_capture(s);
  EXPECT_FALSE(device->capturing());
  EXPECT_EQ(read(acc), 0.0f) << "capture must not run the work";
  EXPECT_EQ(device->graph_streams(graph), (std::vector<std::string>{"compute", "side"}));
  for (int i = 0; i < 3; ++i) device->replay(graph, s);
  EXPECT_EQ(read(acc), 6.0f);
  device->destroy_graph(graph);
  device->synchronize();
  device->free(acc, s);
  device->destroy_event(fork);
  device->destroy_event(join);
}

TEST_F(CudaGraphDevice, AllocationOutlivingTheCaptureIsRefused) {
  device->begin_capture(s);
  void* leaked = device->alloc(64, s, MemTag::Unsharded);
  device->fill(s, leaked, DType::F32, 16, 1.0f);
  try {
    device->end_capture(s);
    FAIL() << "an allocation outliving the graph was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("outlive"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(device->capturing());
  device->free(leaked, s);  // its owner lets go later: only the ledger changes
  EXPECT_EQ(device->memory_stats().current_bytes, 0);
  device->synchronize();  // the device is still usable
}

TEST_F(CudaGraphDevice, HostWaitInsideTheCaptureIsRefusedAndTheDeviceStaysUsable) {
  auto* p = static_cast<float*>(device->alloc(sizeof(float), s, MemTag::Other));
  device->begin_capture(s);
  device->fill(s, p, DType::F32, 1, 3.0f);
  try {
    device->synchronize_stream(s);
    FAIL() << "a host wait was captured";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("host waits for the device"), std::string::npos)
        << e.what();
  }
  device->abort_capture(s);
  device->fill(s, p, DType::F32, 1, 5.0f);
  EXPECT_EQ(read(p), 5.0f);
  device->free(p, s);
}

// ---- the trainer, eager against captured

nlohmann::json run_json(const std::string& args, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/graph_" + name + ".json";
  const testing::CommandResult r = testing::run_fsdp_command(
      "train --backend cuda --nproc 1 --steps 20 --warmup 2 --quiet --json " + path + " " + args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.output;
  std::ifstream in(path);
  if (r.code != 0 || !in) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

std::vector<float> losses_of(const nlohmann::json& j) {
  return j.contains("losses") ? j["losses"].get<std::vector<float>>() : std::vector<float>{};
}

// The first step (1-based) where two loss lists differ; 0 when bitwise equal.
size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return i + 1;
  return a.size() == b.size() ? 0 : std::min(a.size(), b.size()) + 1;
}

void report(const std::string& args, const nlohmann::json& eager, const nlohmann::json& graph) {
  std::printf("%s: streams %s, host us/step eager %.1f graph %.1f, backend peak eager %.1f MiB "
              "graph %.1f MiB, reserved eager %.1f MiB graph %.1f MiB\n",
              args.c_str(), graph["graph_streams"].dump().c_str(),
              eager["host_us_per_step"].get<double>(), graph["host_us_per_step"].get<double>(),
              eager["backend_peak_bytes"].get<double>() / 1048576.0,
              graph["backend_peak_bytes"].get<double>() / 1048576.0,
              eager["backend_reserved_peak_bytes"].get<double>() / 1048576.0,
              graph["backend_reserved_peak_bytes"].get<double>() / 1048576.0);
}

// Eager and captured runs of the same flags: bitwise-identical losses over 20 steps, the graph
// on three streams, its peak bytes in use and reserved within 5% of eager's (plus one
// graph-memory chunk).
// Returns false when the losses differ.
bool expect_bitwise_equal(const std::string& args, const std::string& name,
                          bool require = true) {
  const nlohmann::json eager = run_json(args, name + "_eager");
  const nlohmann::json graph = run_json(args + " --cuda-graph", name + "_graph");
  const auto a = losses_of(eager), b = losses_of(graph);
  EXPECT_EQ(a.size(), 20u) << args;
  EXPECT_EQ(b.size(), 20u) << args;
  if (a.size() != 20u || b.size() != 20u) return false;
  const size_t diff = first_difference(a, b);
  if (require)
    EXPECT_EQ(diff, 0u) << args << ": step " << diff << " differs (eager then graph)";
  else if (diff != 0)
    std::printf("%s: step %zu differs (eager %.9g, graph %.9g)\n", args.c_str(), diff,
                a[diff - 1], b[diff - 1]);
  EXPECT_EQ(graph["cuda_graph"], true);
  EXPECT_EQ(graph["streams_used"].get<int>(), 3) << args;  // compute, all-gather, reduce-scatter
  // The bytes in use at the peak: the pool's, plus under the graph the graph allocator's.
  // CUDA backs graph memory in 32 MiB chunks (measured: every one of these tiny graphs reserves
  // exactly 32 MiB of graph memory), which these models' few MiB of transients cannot fill, so
  // the bound allows one chunk. The same bound holds for the bytes taken from the driver:
  // begin_capture gives the pool's eager-mode cache back first (Note [CUDA graph capture]).
  EXPECT_LE(graph["backend_peak_bytes"].get<double>(),
            1.05 * eager["backend_peak_bytes"].get<double>() + 32.0 * 1048576.0) << args;
  EXPECT_LE(graph["backend_reserved_peak_bytes"].get<double>(),
            1.05 * eager["backend_reserved_peak_bytes"].get<double>() + 32.0 * 1048576.0)
      << args;
  report(args, eager, graph);
  return diff == 0;
}

bool have_gpu() { return cuda::device_count() > 0; }

TEST(CudaGraphTrain, MlpLossesAreBitwiseEagerAndCaptured) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  for (int k : {1, 2})
    for (int sep : {0, 1})
      for (int mb : {1, 4}) {
        const std::string args = "--model mlp --layers 4 --dim 256 --tokens 512 --param-dtype bf16 "
                                 "--rs-max-input-buffers " + std::to_string(k) +
                                 " --separate-rs-group " + std::to_string(sep) +
                                 " --micro-batches " + std::to_string(mb);
        expect_bitwise_equal(args, "mlp_k" + std::to_string(k) + "_s" + std::to_string(sep) +
                                       "_mb" + std::to_string(mb));
      }
  // Each group's optimizer step inside backward, on the reduce-scatter stream.
  expect_bitwise_equal("--model mlp --layers 4 --dim 256 --tokens 512 --param-dtype bf16 "
                       "--clip-grad-norm 0 --optimizer-in-backward 1",
                       "mlp_oib");
}

// cuDNN's fused attention backward may not be deterministic from run to run; where two eager
// runs differ, the check moves to the CUDA-core attention (FSDP_ATTENTION=simt) and says so.
TEST(CudaGraphTrain, TransformerLossesAreBitwiseEagerAndCaptured) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  for (int k : {1, 2})
    for (int mb : {1, 4}) {
      const std::string args =
          "--model transformer --layers 2 --dim 128 --heads 4 --kv-heads 2 --seq-len 64 "
          "--vocab 512 --tokens 256 --param-dtype bf16 --rs-max-input-buffers " +
          std::to_string(k) + " --separate-rs-group " + std::to_string(k - 1) +
          " --micro-batches " + std::to_string(mb);
      const std::string name = "transformer_k" + std::to_string(k) + "_mb" + std::to_string(mb);
      if (expect_bitwise_equal(args, name, /*require=*/false)) continue;
      const auto again = losses_of(run_json(args, name + "_eager_again"));
      const auto first = losses_of(run_json(args, name + "_eager"));
      if (first_difference(first, again) == 0) {
        ADD_FAILURE() << args << ": eager runs agree but the captured run differs";
        continue;
      }
      std::printf("%s: two eager runs differ: cuDNN attention is not deterministic here; "
                  "checking with FSDP_ATTENTION=simt\n", args.c_str());
      setenv("FSDP_ATTENTION", "simt", 1);
      expect_bitwise_equal(args, name + "_simt");
      unsetenv("FSDP_ATTENTION");
    }
}

TEST(CudaGraphTrain, MoeWithExpertMeshLossesAreBitwiseEagerAndCaptured) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  expect_bitwise_equal("--model moe --layers 2 --dim 128 --experts 4 --tokens 256 "
                       "--param-dtype bf16 --micro-batches 2",
                       "moe");
}

// Eager against captured where the model has attention: cuDNN's fused attention backward may
// not be deterministic from run to run, and where two eager runs differ the check moves to the
// CUDA-core attention (FSDP_ATTENTION=simt) and says so, as the transformer's test does.
void expect_bitwise_equal_with_attention(const std::string& args, const std::string& name) {
  if (expect_bitwise_equal(args, name, /*require=*/false)) return;
  const auto again = losses_of(run_json(args, name + "_eager_again"));
  const auto first = losses_of(run_json(args, name + "_eager"));
  if (first_difference(first, again) == 0) {
    ADD_FAILURE() << args << ": eager runs agree but the captured run differs";
    return;
  }
  std::printf("%s: two eager runs differ: cuDNN attention is not deterministic here; "
              "checking with FSDP_ATTENTION=simt\n", args.c_str());
  setenv("FSDP_ATTENTION", "simt", 1);
  expect_bitwise_equal(args, name + "_simt");
  unsetenv("FSDP_ATTENTION");
}

// Note [Optimizer in forward]: each group's step in the next forward, on the all-gather stream,
// writing the all-gather's input: with clipping on, the step after backward's losses and grad
// norms bit for bit, eager and captured (the attention on CUDA cores, which is deterministic).
TEST(CudaGraphTrain, OptimizerInForwardIsBitwiseTheStepAfterBackward) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  const std::string mlp = "--model mlp --layers 4 --dim 256 --tokens 512 --param-dtype bf16 "
                          "--clip-grad-norm 0.5 --optimizer-in-backward 0 --micro-batches 2";
  const std::string transformer =
      "--model transformer --layers 2 --dim 128 --heads 4 --kv-heads 2 --seq-len 64 --vocab 512 "
      "--tokens 256 --param-dtype bf16 --clip-grad-norm 0.5";
  setenv("FSDP_ATTENTION", "simt", 1);
  const std::vector<std::pair<std::string, std::string>> runs = {{mlp, "mlp"},
                                                                  {transformer, "transformer"}};
  for (const auto& [args, name] : runs) {
    const nlohmann::json plain = run_json(args, name + "_plain");
    const nlohmann::json in_forward = run_json(args + " --optimizer-in-forward 1", name + "_oif");
    EXPECT_EQ(first_difference(losses_of(plain), losses_of(in_forward)), 0u) << args;
    EXPECT_EQ(plain["grad_norms"], in_forward["grad_norms"]) << args;
    expect_bitwise_equal(args + " --optimizer-in-forward 1", name + "_oif");
  }
  unsetenv("FSDP_ATTENTION");
}

// With a capacity factor the MoE layers route on the device (Note [Device MoE routing]), so the
// whole step captures: the top-k, the capacity, the aux loss and its gradient included.
TEST(CudaGraphTrain, MoeTransformerWithCapacityLossesAreBitwiseEagerAndCaptured) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  for (int k : {1, 2})
    for (int mb : {1, 4}) {
      const std::string args =
          "--model moe-transformer --layers 2 --dim 128 --heads 4 --seq-len 64 --vocab 512 "
          "--experts 4 --top-k 2 --tokens 256 --capacity-factor 1.25 --param-dtype bf16 "
          "--rs-max-input-buffers " + std::to_string(k) + " --micro-batches " +
          std::to_string(mb);
      expect_bitwise_equal_with_attention(
          args, "moe_transformer_k" + std::to_string(k) + "_mb" + std::to_string(mb));
    }
}

TEST(CudaGraphTrain, DroplessMoeTransformerIsRefusedInOneLine) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  const testing::CommandResult r = testing::run_fsdp_command(
      "train --backend cuda --nproc 1 --steps 4 --cuda-graph --model moe-transformer "
      "--layers 2 --dim 128 --heads 4 --seq-len 64 --vocab 512 --tokens 256");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("with dropless routing"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--capacity-factor > 0 routes on the device and captures"),
            std::string::npos) << r.output;
}

}  // namespace
}  // namespace fsdp
