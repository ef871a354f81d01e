// Ranks as threads of one process sharing a CpuWorld (the in-process "network").
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fsdp/error.h"
#include "launch/cpu_ranks.h"

namespace fsdp {

using detail::concat;

namespace launch {

namespace {

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// fsdp::Errors already name their rank (Note [Errors]) and UserErrors are plain sentences;
// anything else a rank body throws becomes an fsdp::Error that names the rank.
std::exception_ptr named_rank_error(int rank, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const Error&) {
    return error;
  } catch (...) {
    return std::make_exception_ptr(Error(concat("[rank ", rank, "] failed: ", message_of(error))));
  }
}

}  // namespace

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
        // Abort the world so the other ranks stop instead of waiting in a collective; their
        // errors name this rank as the one lost ("aborted: rank 1 failed: ...").
        std::exception_ptr error = named_rank_error(rank, std::current_exception());
        std::lock_guard<std::mutex> lock(mutex);
        if (!first_error) first_error = error;
        world.abort(concat("rank ", rank, " failed: ", message_of(error)));
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
