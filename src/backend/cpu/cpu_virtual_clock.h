// The CPU backend's virtual clock: simulated time for timed ops. See Note [Virtual clock] in
// cpu_virtual_clock.cpp.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

namespace fsdp::cpu {

class VirtualClock;
class Cancellation;
struct SharedChannel;

// How a job shares its channel (Note [Shared channels]): its factor for each other active job
// of its own priority (< 0: the channel's), of a higher one (`yield`) and of a lower one
// (`lead`) (< 0: its own factor for both), and its priority (0 or 1).
struct ChannelShare {
  double sharing = -1;
  double yield = -1;
  double lead = -1;
  int priority = 0;
};

// A thread whose progress simulated time waits for: a stream worker, or the host thread that
// drives a device. Its state is guarded by its clock's mutex.
struct ClockParticipant {
  enum class State : uint8_t { Running, Blocked, Sleeping, Settling };
  VirtualClock* clock = nullptr;
  State state = State::Running;
  double wake_at_us = 0;  // Sleeping: when it runs again
  // Sleeping on a SharedChannel instead: the work (microseconds at the channel's full
  // capacity) still to do.
  SharedChannel* channel = nullptr;
  double remaining_us = 0;
  ChannelShare share;  // how this job shares its channel (Note [Shared channels])
};

// Note [Shared channels]
// A capacity that the participants sleeping on it share: while n of them sleep on it, each
// progresses at 1 / (1 + sharing * (n - 1)) of its work per microsecond. sharing 1 is an
// equal split (a job of w microseconds alone takes n * w while n - 1 others run beside it the
// whole time); 0 leaves every job its full speed. The simulation backend puts a collective's
// transfer on its link's channel (sharing 1), so that collectives of separate communicators
// over one link slow each other down as they do on the wire, and a kernel on its device's
// channel (the calibration's sharing), so that kernels of different streams slow each other
// down as they do on a GPU. The rates change only when a job starts or ends, and time advances
// from one such event to the next, so the sharing is exact (a fluid model, not a sampled one).
// A job may bring its own factor instead of the channel's (its rate is then 1 / (1 + s (n - 1))
// with its own s, up to 4): the simulated GPU gives memory-bound kernels their own, as they lose
// more to the kernels beside them than a GEMM does. A job may also bring a priority (0 or 1) and
// factors for the jobs above and below it (ChannelShare): each other active job then adds
// s (its own priority), y (a higher one) or l (a lower one) to its stretch, as a GPU's block
// scheduler hands free SMs to the high-priority stream's kernels first: a normal-priority
// kernel beside them waits for what they leave (y > s) and they lose little to it (l < s).
// y = l = s (the default) is the plain split. Guarded by the clock's mutex.
constexpr int kChannelPriorities = 2;
struct SharedChannel {
  std::array<int, kChannelPriorities> active_at{};  // participants sleeping on it, by priority
  double sharing = 1.0;  // in [0, 1]
  // How much longer a job of these (resolved) factors takes while it and the others share the
  // channel.
  double stretch(const ChannelShare& job) const {
    int above = 0, below = 0;
    for (int q = 0; q < kChannelPriorities; ++q) {
      if (q > job.priority) above += active_at[q];
      if (q < job.priority) below += active_at[q];
    }
    const int same = std::max(active_at[job.priority] - 1, 0);  // the others of its priority
    return 1.0 + job.sharing * same + job.yield * above + job.lead * below;
  }
};

class VirtualClock {
 public:
  // Simulated time stays at 0 until `hosts` device hosts have joined (every rank's device
  // exists), so ranks that start late in wall time still start together. A timed op that
  // waits longer than `start_timeout_s` of wall time (0: forever) for that fails instead.
  VirtualClock(int hosts, double start_timeout_s);

  double now_us() const;

  // Adds a participant, Running. A host participant counts towards the start condition.
  void join(ClockParticipant& p, bool host);
  void leave(ClockParticipant& p);
  // Running -> Blocked: it waits for another participant to act. Callers hold the mutex of
  // the state they wait on, and so does whoever later wakes them (lock order: that mutex,
  // then the clock's).
  void block(ClockParticipant& p);
  // Blocked -> Running; no-op otherwise.
  void wake(ClockParticipant& p);
  // Lets `us` of simulated time pass for p (which must be Running), waking in wall time once
  // the clock reaches it. Throws fsdp::Error if `cancel` fires first (p is Running again).
  void sleep_for(ClockParticipant& p, double us, const Cancellation* cancel);
  // The same for `work_us` of work on a shared channel (Note [Shared channels]): it ends once
  // the work is done at the share the channel gives p from moment to moment, by `share`.
  void sleep_on_channel(ClockParticipant& p, SharedChannel& channel, double work_us,
                        const Cancellation* cancel, ChannelShare share = {});
  // For a host that asks about progress (query_event): returns once no other participant is
  // Running, so everything due at the current simulated time has happened and the answer is
  // the same on every run. p is Running again, and alone, so nothing moves until it waits.
  void settle(ClockParticipant& p, const Cancellation* cancel);
  // After settle: moves simulated time on to the next wake-up, so a host that polls steps
  // through simulated time instead of holding it still.
  void step(ClockParticipant& p);

 private:
  void advance_if_idle();  // mutex_ held
  void advance();          // mutex_ held, nobody Running: on to the next wake-up, if any
  // mutex_ held: how much longer p's channel job takes at the shares of now.
  static double stretch_of(const ClockParticipant& p) {
    return p.channel->stretch(p.share);
  }
  // mutex_ held: p's channel job is over (or cancelled).
  static void leave_channel(ClockParticipant& p);
  // mutex_ held: sleeps p (state Sleeping already) until something wakes it.
  void wait_asleep(std::unique_lock<std::mutex>& lock, ClockParticipant& p,
                   const Cancellation* cancel);

  mutable std::mutex mutex_;
  std::condition_variable sleepers_cv_;
  double now_us_ = 0;
  int running_ = 0;
  int settling_ = 0;  // hosts waiting in settle(): time waits for them to ask
  int hosts_missing_;
  const double start_timeout_s_;
  std::vector<ClockParticipant*> participants_;
};

// The participant of the calling thread (its stream worker, or the device it hosts), or null.
ClockParticipant* this_thread_participant();
void set_this_thread_participant(ClockParticipant* p);

// A condition variable that the virtual clock sees: a waiter counts as Blocked, and
// notify_all marks every waiter Running at once, before its thread wakes, so simulated time
// cannot advance past it in between. Without a clock it is a plain condition variable.
// Every call is made holding the mutex that guards the waited-on state.
class ClockedCondition {
 public:
  void notify_all();
  // Blocks until done() holds. Polls `cancel` (when given) every kCancelPollInterval and
  // throws fsdp::Error when it fires. Returns false if `deadline` (wall time) passed first.
  bool wait(std::unique_lock<std::mutex>& lock, const Cancellation* cancel,
            const std::function<bool()>& done,
            std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);

 private:
  void enlist(ClockParticipant* self);  // registers self as a Blocked waiter, if not yet
  void discharge(ClockParticipant* self);  // self is done waiting: Running, not a waiter

  std::condition_variable cv_;
  std::vector<ClockParticipant*> waiters_;
};

}  // namespace fsdp::cpu
