// The public launcher (include/fsdp/launch.h): every rank runs with its own device and a
// world communicator, a failing rank stops the others and its error reaches the caller, and
// a CUDA launch where there is no CUDA is a clear error rather than a hang.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>

#include "fsdp/error.h"
#include "fsdp/launch.h"

namespace fsdp::testing {
namespace {

TEST(PublicLauncher, EveryCpuRankRunsWithItsOwnDeviceAndTheWorld) {
  std::mutex mutex;
  std::set<int> ranks;
  std::set<std::string> devices;
  run_cpu_ranks(3, [&](int rank, Device& device, std::shared_ptr<Comm> world) {
    EXPECT_EQ(world->rank(), rank);
    EXPECT_EQ(world->size(), 3);
    // A collective over the world: the sum of the ranks arrives everywhere.
    const Stream s = device.create_stream("s", StreamPriority::Normal);
    float* x = static_cast<float*>(device.alloc(2 * sizeof(float), s, MemTag::Other));
    const float mine = static_cast<float>(rank);
    device.copy_from_host(s, x, &mine, sizeof mine);
    world->all_reduce(x, x + 1, 1, DType::F32, ReduceOp::Sum, s);
    float sum = 0;
    device.copy_to_host(s, &sum, x + 1, sizeof sum);
    device.synchronize_stream(s);
    device.free(x, s);
    EXPECT_EQ(sum, 0.0f + 1.0f + 2.0f);
    std::lock_guard<std::mutex> lock(mutex);
    ranks.insert(rank);
    devices.insert(device.name());
  });
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(devices.size(), 3u);
}

TEST(PublicLauncher, AFailingRankStopsTheOthersAndItsErrorReachesTheCaller) {
  std::atomic<int> finished{0};
  try {
    run_cpu_ranks(2, [&](int rank, Device& device, std::shared_ptr<Comm> world) {
      if (rank == 1) FSDP_FAIL("rank one gives up");
      // Rank 0 waits in a collective that rank 1 never joins: the launch must end it.
      const Stream s = device.create_stream("s", StreamPriority::Normal);
      float* x = static_cast<float*>(device.alloc(2 * sizeof(float), s, MemTag::Other));
      world->all_reduce(x, x + 1, 1, DType::F32, ReduceOp::Sum, s);
      device.synchronize_stream(s);
      ++finished;
    });
    FAIL() << "the launch returned normally";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank one gives up"), std::string::npos) << e.what();
  }
  EXPECT_EQ(finished, 0);
}

TEST(PublicLauncher, ZeroRanksIsAClearError) {
  EXPECT_THROW(run_cpu_ranks(0, [](int, Device&, std::shared_ptr<Comm>) {}), Error);
}

TEST(PublicLauncher, CudaWithoutAGpuIsAClearError) {
  if (cuda_backend_built() && visible_gpu_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  if (under_external_launcher()) GTEST_SKIP() << "RANK and WORLD_SIZE are set";
  bool ran = false;
  try {
    run_cuda_ranks(0, [&](int, Device&, std::shared_ptr<Comm>) { ran = true; });
    FAIL() << "a CUDA launch without a GPU returned normally";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("no CUDA backend") != std::string::npos ||
                what.find("no CUDA GPU") != std::string::npos)
        << what;
  }
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace fsdp::testing
