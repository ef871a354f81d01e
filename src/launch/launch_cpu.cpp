// Ranks as threads of one process sharing a CpuWorld (the in-process "network").
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "fsdp/error.h"
#include "launch/cpu_ranks.h"

namespace fsdp {

namespace launch {

void run_cpu_world(int world_size, const cpu::CpuOptions& options, const RankBody& body) {
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
        // Abort the world so the other ranks stop instead of waiting in a collective.
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = std::current_exception();
        world.abort("another rank failed");
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace launch

void run_cpu_ranks(int world_size, const RankBody& body, const CpuLaunchOptions& options) {
  cpu::CpuOptions o;
  o.checked = options.checked;
  o.chaos = options.chaos;
  o.chaos_seed = options.chaos_seed;
  o.chaos_max_us = options.chaos_max_us;
  o.link_gbps = options.link_gbps;
  launch::run_cpu_world(world_size, o, body);
}

}  // namespace fsdp
