// CpuWorld and the state it shares with its devices and communicators.
#include <cstdlib>
#include <numeric>
#include <thread>
#include <utility>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_comm.h"
#include "backend/cpu/cpu_device.h"
#include "backend/cpu/cpu_world_state.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

double default_collective_timeout_s() {
  const char* env = std::getenv("FSDP_CPU_COLLECTIVE_TIMEOUT_S");
  if (env == nullptr || *env == '\0') return 60.0;
  char* end = nullptr;
  const double seconds = std::strtod(env, &end);
  FSDP_CHECK(end != env && *end == '\0' && seconds >= 0,
             "FSDP_CPU_COLLECTIVE_TIMEOUT_S must be a number of seconds >= 0, got '", env, "'");
  return seconds;
}

// ---- WorldState

WorldState::WorldState(int world_size, CpuOptions opts)
    : size(world_size),
      options(opts),
      origin(std::chrono::steady_clock::now()),
      clock(opts.virtual_clock
                ? std::make_unique<VirtualClock>(world_size, opts.collective_timeout_s)
                : nullptr),
      world_comms_made_(static_cast<size_t>(world_size), 0) {}

double WorldState::now_us() const {
  if (clock) return clock->now_us();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin)
      .count();
}

void WorldState::pass_time(double us, const Cancellation* cancel) const {
  if (!(us > 0)) return;
  if (!clock) {
    std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(us));
    return;
  }
  ClockParticipant* self = this_thread_participant();
  FSDP_CHECK(self != nullptr && self->clock == clock.get(),
             "virtual clock: timed work on a thread that is not one of the world's streams");
  clock->sleep_for(*self, us, cancel);
}

void WorldState::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_.load(std::memory_order_relaxed)) return;  // the first reason is the cause
    abort_reason_ = why;
  }
  // Waiters poll this flag (kCancelPollInterval), so they all wake within one interval.
  aborted_.store(true, std::memory_order_release);
}

std::string WorldState::abort_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_reason_;
}

std::shared_ptr<CommShared> WorldState::world_comm(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int k = world_comms_made_[static_cast<size_t>(rank)]++;
  if (k == static_cast<int>(world_comms_.size())) {
    std::vector<int> ranks(static_cast<size_t>(size));
    std::iota(ranks.begin(), ranks.end(), 0);
    world_comms_.push_back(
        std::make_shared<CommShared>(k == 0 ? "world" : detail::concat("world#", k), ranks,
                                     options.link_gbps, options.collective_timeout_s));
  }
  return world_comms_[static_cast<size_t>(k)];
}

// ---- StickyError and Cancellation

void StickyError::set(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (set_.load(std::memory_order_relaxed)) return;  // the first failure is the cause
  message_ = message;
  set_.store(true, std::memory_order_release);
}

void StickyError::rethrow_if_set() const {
  if (!is_set()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // The message already names the rank, device and source line where the work failed.
  throw Error(message_);
}

void Cancellation::throw_if_cancelled() const {
  if (world_.aborted()) FSDP_FAIL("aborted: ", world_.abort_reason());
  error_.rethrow_if_set();
  if (shutting_down_.load(std::memory_order_acquire))
    FSDP_FAIL("device destroyed while work on it was still waiting");
}

// ---- CpuWorld

struct CpuWorld::Impl {
  std::shared_ptr<WorldState> state;
};

CpuWorld::CpuWorld(int world_size, CpuOptions options) : impl_(std::make_unique<Impl>()) {
  FSDP_CHECK(world_size >= 1, "CPU world size ", world_size, " (need at least 1)");
  FSDP_CHECK(options.chaos_max_us >= 0, "chaos_max_us ", options.chaos_max_us);
  FSDP_CHECK(options.collective_timeout_s >= 0, "collective_timeout_s ",
             options.collective_timeout_s, " (need >= 0; 0 waits forever)");
  impl_->state = std::make_shared<WorldState>(world_size, options);
}

// Devices and communicators keep the shared state alive, so the world may go first.
CpuWorld::~CpuWorld() = default;

int CpuWorld::size() const {
  return impl_->state->size;
}
const CpuOptions& CpuWorld::options() const {
  return impl_->state->options;
}

std::unique_ptr<Device> CpuWorld::make_device(int rank) {
  FSDP_CHECK(rank >= 0 && rank < size(), "rank ", rank, " outside the CPU world of ", size());
  return std::make_unique<CpuDevice>(impl_->state, rank);
}

std::unique_ptr<Comm> CpuWorld::make_world_comm(int rank, Device& device) {
  FSDP_CHECK(rank >= 0 && rank < size(), "rank ", rank, " outside the CPU world of ", size());
  auto* cpu_device = dynamic_cast<CpuDevice*>(&device);
  FSDP_CHECK(cpu_device != nullptr, "make_world_comm needs a CPU device, got ", device.name());
  FSDP_CHECK(cpu_device->rank() == rank && cpu_device->world() == impl_->state,
             "make_world_comm for rank ", rank, " with device ", device.name(),
             ", which belongs to another rank or world");
  std::shared_ptr<CommShared> shared = impl_->state->world_comm(rank);
  const std::string name = shared->name;
  return std::make_unique<CpuComm>(*cpu_device, std::move(shared), rank, name);
}

void CpuWorld::abort(const std::string& why) {
  impl_->state->abort(why);
}
bool CpuWorld::aborted() const {
  return impl_->state->aborted();
}

}  // namespace fsdp::cpu
