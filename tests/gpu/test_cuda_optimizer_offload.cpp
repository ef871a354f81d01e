// The optimizer offload on the CUDA backend (Note [Optimizer offload]): `fsdp train --offload
// optimizer` against the device optimizer. The host runs the CPU backend's AdamW, the device
// its own kernel (which may contract into fused multiply-adds), so the steps agree within
// rounding, not bit for bit; the device's peak is lower by about the optimizer state; the
// host steps and transfers are on their own tracks of the trace; a host limit that the state
// does not fit is one line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "../command_util.h"
#include "backend/cuda/cuda_backend.h"

namespace fsdp {
namespace {

const char* kModel =
    "--model transformer --layers 4 --dim 256 --heads 4 --kv-heads 2 --seq-len 128 --vocab 512 "
    "--tokens 1024 --param-dtype bf16 --reduce-dtype fp32 --clip-grad-norm 1.0";

nlohmann::json run_json(const std::string& args, const std::string& name) {
  const std::string path = ::testing::TempDir() + "/offload_" + name + ".json";
  const testing::CommandResult r = testing::run_fsdp_command(
      "train --backend cuda --nproc 1 --steps 8 --warmup 2 --quiet --json " + path + " " + args);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.output;
  std::ifstream in(path);
  if (r.code != 0 || !in) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

TEST(CudaOptimizerOffload, TracksTheDeviceOptimizerWithALowerPeak) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const nlohmann::json device = run_json(kModel, "device");
  const nlohmann::json host = run_json(std::string(kModel) + " --offload optimizer", "host");
  ASSERT_TRUE(device.contains("losses") && host.contains("losses"));
  EXPECT_EQ(host["offload"], "optimizer");
  ASSERT_EQ(device["losses"].size(), host["losses"].size());
  for (size_t i = 0; i < device["losses"].size(); ++i) {
    const double a = device["losses"][i], b = host["losses"][i];
    EXPECT_NEAR(b, a, 1e-2 * std::abs(a)) << "step " << i;
  }
  const double peak_device = device.value("peak_mem_bytes", 0.0);
  const double peak_host = host.value("peak_mem_bytes", 0.0);
  std::printf("peak %.1f MiB with the device optimizer, %.1f MiB offloaded; step_ms median %.3f "
              "vs %.3f\n", peak_device / 1048576.0, peak_host / 1048576.0,
              device.value("step_ms_median", 0.0), host.value("step_ms_median", 0.0));
  EXPECT_LT(peak_host, peak_device);
}

TEST(CudaOptimizerOffload, AHostLimitTheStateDoesNotFitIsOneLine) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU";
  const testing::CommandResult r = testing::run_fsdp_command(
      std::string("train --backend cuda --nproc 1 --steps 1 ") + kModel +
      " --offload optimizer --host-memory-limit-mib 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("is the host memory limit"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace fsdp
