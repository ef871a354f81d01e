// The CPU backend's collective timeout (CpuOptions::collective_timeout_s): a collective whose
// peers never come fails with an error naming the communicator, its sequence number and the
// ranks that did not arrive, on every rank, instead of hanging the run. The timeouts here are
// short bounds on failure, not timing assertions.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "cpu_test_util.h"
#include "fsdp/comm.h"
#include "fsdp/error.h"

namespace fsdp::cpu {
namespace {

using cpu_test::Floats;
using cpu_test::upload;

// Runs fn(rank, device, world communicator) on one thread per rank and returns each rank's
// error message ("" if it ended cleanly). Unlike the launcher it never aborts the world, so
// each rank's error is its own.
std::vector<std::string> run_ranks_collecting_errors(
    CpuWorld& world, const std::function<void(int, Device&, Comm&)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(world.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        auto device = world.make_device(r);
        auto comm = world.make_world_comm(r, *device);
        fn(r, *device, *comm);
        device->synchronize();
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

CpuOptions short_timeout() {
  CpuOptions o;
  o.collective_timeout_s = 1;
  return o;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Rank 0 all-gathers on "first" then "second", rank 1 the other way round: each waits for the
// other on a different communicator, as when the AG order differs between ranks.
TEST(CpuCollectiveTimeout, CrossCommunicatorDeadlockFailsOnEveryRank) {
  CpuWorld world(2, short_timeout());
  const auto errors = run_ranks_collecting_errors(world, [](int rank, Device& dev, Comm& comm) {
    auto first = comm.split(0, rank, "first");
    auto second = comm.split(0, rank, "second");
    Stream s = dev.create_stream("ag", StreamPriority::Normal);
    void* in = upload(dev, s, Floats(4, 1.0f), DType::F32);
    void* out = dev.alloc(2 * 4 * sizeof(float), s, MemTag::AllGather);
    Comm& a = rank == 0 ? *first : *second;
    Comm& b = rank == 0 ? *second : *first;
    a.all_gather(in, out, 4, DType::F32, s);
    b.all_gather(in, out, 4, DType::F32, s);
    try {
      dev.synchronize();
    } catch (...) {
      dev.free(in, s);
      dev.free(out, s);
      throw;
    }
  });
  EXPECT_TRUE(contains(errors[0], "all_gather #0 on communicator 'first' timed out after 1 s: "
                                  "rank 1 has not arrived at #0"))
      << errors[0];
  EXPECT_TRUE(contains(errors[1], "all_gather #0 on communicator 'second' timed out after 1 s: "
                                  "rank 0 has not arrived at #0"))
      << errors[1];
  // The error is raised on the rank's stream, so it names where it happened.
  EXPECT_TRUE(contains(errors[0], "[rank 0 cpu:0]")) << errors[0];
  EXPECT_TRUE(contains(errors[1], "[rank 1 cpu:1]")) << errors[1];
}

// Ranks 0 and 1 all-reduce; rank 2 never issues it. Both waiting ranks fail naming rank 2,
// the second one possibly through the first one's timeout (it abandons the collective).
TEST(CpuCollectiveTimeout, ARankThatNeverArrivesIsNamed) {
  CpuWorld world(3, short_timeout());
  const auto errors = run_ranks_collecting_errors(world, [](int rank, Device& dev, Comm& comm) {
    if (rank == 2) return;  // never takes part
    Stream s = dev.create_stream("s", StreamPriority::Normal);
    void* buf = upload(dev, s, Floats(4, 1.0f), DType::F32);
    comm.all_reduce(buf, buf, 4, DType::F32, ReduceOp::Sum, s);
    try {
      dev.synchronize();
    } catch (...) {
      dev.free(buf, s);
      throw;
    }
  });
  for (int r : {0, 1}) {
    EXPECT_TRUE(contains(errors[r], "all_reduce #0 on communicator 'world'")) << errors[r];
    EXPECT_TRUE(contains(errors[r], "timed out after 1 s: rank 2 has not arrived at #0"))
        << errors[r];
  }
  EXPECT_EQ(errors[2], "");
}

// A collective queued behind a stuck one on the same communicator (issued on another stream)
// also times out, naming the collective it is stuck behind.
TEST(CpuCollectiveTimeout, ACollectiveBehindAStuckOneNamesIt) {
  CpuWorld world(2, short_timeout());
  const auto errors = run_ranks_collecting_errors(world, [](int rank, Device& dev, Comm& comm) {
    if (rank == 1) return;
    Stream s1 = dev.create_stream("s1", StreamPriority::Normal);
    Stream s2 = dev.create_stream("s2", StreamPriority::Normal);
    void* a = upload(dev, s1, Floats(4, 1.0f), DType::F32);
    void* b = upload(dev, s2, Floats(4, 1.0f), DType::F32);
    comm.all_reduce(a, a, 4, DType::F32, ReduceOp::Sum, s1);  // #0: rank 1 never comes
    comm.all_reduce(b, b, 4, DType::F32, ReduceOp::Sum, s2);  // #1
    std::string message;
    try {
      dev.synchronize_stream(s2);
    } catch (const Error& e) {
      message = e.what();
    }
    dev.free(a, s1);
    dev.free(b, s2);
    FSDP_FAIL(message);
  });
  // #1 either timed out waiting for #0, or got its turn once #0 gave up and then timed out
  // waiting for rank 1 itself; the error is the first one of the device, #0's or #1's.
  EXPECT_TRUE(contains(errors[0], "on communicator 'world' timed out after 1 s")) << errors[0];
  EXPECT_TRUE(contains(errors[0], "rank 1 has not arrived at #")) << errors[0];
}

TEST(CpuCollectiveTimeout, DefaultComesFromTheEnvironment) {
  const char* saved = std::getenv("FSDP_CPU_COLLECTIVE_TIMEOUT_S");
  const std::string restore = saved ? saved : "";
  ::setenv("FSDP_CPU_COLLECTIVE_TIMEOUT_S", "7.5", 1);
  EXPECT_EQ(CpuOptions{}.collective_timeout_s, 7.5);
  ::setenv("FSDP_CPU_COLLECTIVE_TIMEOUT_S", "soon", 1);
  EXPECT_THROW(CpuOptions{}, Error);
  ::unsetenv("FSDP_CPU_COLLECTIVE_TIMEOUT_S");
  EXPECT_EQ(CpuOptions{}.collective_timeout_s, 60.0);
  if (saved) ::setenv("FSDP_CPU_COLLECTIVE_TIMEOUT_S", restore.c_str(), 1);
  CpuOptions negative;
  negative.collective_timeout_s = -1;
  EXPECT_THROW(CpuWorld(1, negative), Error);
}

}  // namespace
}  // namespace fsdp::cpu
