#include <exception>
#include <mutex>
#include <thread>

#include "fsdp/error.h"
#include "runtime/launch.h"

namespace fsdp::runtime {

void run_cpu_ranks(int world_size, const cpu::CpuOptions& options, const RankBody& body) {
  FSDP_CHECK(world_size >= 1, "world size must be >= 1, got ", world_size);
  cpu::CpuWorld world(world_size, options);
  std::mutex mutex;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      this_thread_identity() = {rank, "cpu:" + std::to_string(rank)};
      try {
        std::unique_ptr<Device> device = world.make_device(rank);
        std::shared_ptr<Comm> comm = world.make_world_comm(rank, *device);
        body(rank, *device, comm);
        device->synchronize();
        comm.reset();
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = std::current_exception();
        world.abort("another rank failed");
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace fsdp::runtime
