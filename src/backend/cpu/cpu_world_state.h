// State shared by everything of one CPU launch: the world, its devices and communicators.
// Devices and communicators hold it by shared_ptr, so it outlives whichever of them the
// caller happens to destroy last.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_virtual_clock.h"

namespace fsdp::cpu {

struct CommShared;

// How long a blocking wait sleeps between looks at the abort flag. Abort does not know every
// condition variable that someone may be blocked on, so every wait polls instead.
constexpr std::chrono::milliseconds kCancelPollInterval{20};

struct WorldState {
  WorldState(int world_size, CpuOptions opts);

  const int size;
  const CpuOptions options;
  // The timeline clock's origin, shared by all ranks so their timelines line up.
  const std::chrono::steady_clock::time_point origin;
  // Null unless options.virtual_clock; then it is the timeline's clock.
  const std::unique_ptr<VirtualClock> clock;

  double now_us() const;
  // Lets `us` microseconds pass on the calling thread: simulated with the virtual clock (the
  // thread must be a participant), else a sleep.
  void pass_time(double us, const Cancellation* cancel) const;
  void abort(const std::string& why);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const;

  // The shared half of the k-th communicator over all ranks: the k-th make_world_comm call
  // of every rank joins the same one, as the k-th ncclCommInitRank with one id would.
  std::shared_ptr<CommShared> world_comm(int rank);

 private:
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;
  std::string abort_reason_;
  std::vector<std::shared_ptr<CommShared>> world_comms_;
  std::vector<int> world_comms_made_;  // per rank: how many make_world_comm calls so far
};

// An error raised by enqueued work. It is sticky, as a CUDA error is: once set, streams
// skip further work and every synchronize rethrows it.
class StickyError {
 public:
  void set(const std::string& message);  // keeps the first message
  bool is_set() const { return set_.load(std::memory_order_acquire); }
  void rethrow_if_set() const;

 private:
  std::atomic<bool> set_{false};
  mutable std::mutex mutex_;
  std::string message_;
};

// What a blocking wait checks while it waits: the world's abort, its device's shutdown, and
// its device's sticky error (the rest of that device's work is skipped anyway, so waiting on
// would only risk a hang).
class Cancellation {
 public:
  Cancellation(const WorldState& world, const std::atomic<bool>& shutting_down,
               const StickyError& error)
      : world_(world), shutting_down_(shutting_down), error_(error) {}
  void throw_if_cancelled() const;

 private:
  const WorldState& world_;
  const std::atomic<bool>& shutting_down_;
  const StickyError& error_;
};

}  // namespace fsdp::cpu
