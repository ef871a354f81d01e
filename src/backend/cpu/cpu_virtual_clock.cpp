// Note [Virtual clock]
// With CpuOptions::virtual_clock, time on the CPU backend is simulated: the ops that take
// time (Device::spin, the simulated link of CpuOptions::link_gbps, chaos delays) let
// simulated time pass instead of sleeping, everything else takes none, and now_us() and the
// timeline report simulated microseconds. A timing test then gets exact values on any
// machine, however loaded, and a run costs only the wall time of its real work.
//
// It is a discrete-event scheme over the threads of one world. Every stream worker and the
// host thread of every device is a participant, in one of three states:
//  - Running: it may still enqueue, record, arrive or finish something at the current time;
//  - Blocked: it waits for another participant (a task in its queue, an event, the peers of
//    a collective, a stream to go idle);
//  - Sleeping: it runs a timed op and waits for simulated time to reach that op's end.
// Simulated time advances only when no participant is Running: it jumps to the earliest
// wake-up, and those sleepers become Running. So a timed op starts at the simulated time when
// whatever it waited for happened, and ends exactly its duration later, whatever the OS did
// in between. Two rules make that hold:
//  - A waiter is woken by whoever satisfies its wait, at once (ClockedCondition::notify_all
//    marks it Running under the same mutex), not when its thread gets a core; otherwise time
//    could jump while it sits runnable but unscheduled.
//  - A host thread is Running except while blocked in a backend wait (synchronize, an event
//    sync, split), so everything it enqueues between two waits is issued at one instant.
//    Drive each device from the thread that made it, one device per thread, and never block
//    that thread outside the backend on progress of the world (say, joining another rank):
//    simulated time would stand still, and with it every timed op.
// A host that asks about progress (query_event) gets the answer for the current simulated
// time once everything due then has happened (VirtualClock::settle), and a "no" moves time on
// to the next wake-up, so a polling loop steps through simulated time, the same on every run.
// Simulated time starts when every rank's device exists, so ranks start together (a timed op
// fails after the collective timeout if one never does). A collective's time is the link
// model's: all members leave the link time after the last has arrived, and its data lands at
// the end, so a buffer freed during the transfer is written after its free for certain.
// Timeouts (the collective timeout, the cancellation polls) stay in wall time. With chaos
// mode on too, the chaos delays are simulated as well, so a seed gives the same timeline
// whatever the load, and a schedule bug that one seed exposes, it exposes on every run.
// Work that takes no simulated time can still tie with other work at one instant; its order
// there is the OS's, as before, but no simulated time depends on it.
#include "backend/cpu/cpu_virtual_clock.h"

#include <algorithm>
#include <limits>

#include "backend/cpu/cpu_world_state.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

namespace {
thread_local ClockParticipant* t_participant = nullptr;
}  // namespace

ClockParticipant* this_thread_participant() {
  return t_participant;
}
void set_this_thread_participant(ClockParticipant* p) {
  t_participant = p;
}

// ---- VirtualClock

VirtualClock::VirtualClock(int hosts, double start_timeout_s)
    : hosts_missing_(hosts), start_timeout_s_(start_timeout_s) {}

double VirtualClock::now_us() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return now_us_;
}

void VirtualClock::join(ClockParticipant& p, bool host) {
  std::lock_guard<std::mutex> lock(mutex_);
  p.clock = this;
  p.state = ClockParticipant::State::Running;
  participants_.push_back(&p);
  ++running_;
  if (host) --hosts_missing_;
}

void VirtualClock::leave(ClockParticipant& p) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find(participants_.begin(), participants_.end(), &p);
  if (it == participants_.end()) return;
  participants_.erase(it);
  if (p.state == ClockParticipant::State::Running) --running_;
  p.state = ClockParticipant::State::Blocked;
  advance_if_idle();
}

void VirtualClock::block(ClockParticipant& p) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (p.state != ClockParticipant::State::Running) return;
  p.state = ClockParticipant::State::Blocked;
  --running_;
  advance_if_idle();
}

void VirtualClock::wake(ClockParticipant& p) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (p.state != ClockParticipant::State::Blocked) return;
  p.state = ClockParticipant::State::Running;
  ++running_;
}

void VirtualClock::sleep_for(ClockParticipant& p, double us, const Cancellation* cancel) {
  if (!(us > 0)) return;
  std::unique_lock<std::mutex> lock(mutex_);
  FSDP_CHECK(p.state == ClockParticipant::State::Running, "virtual clock: a timed op on a thread "
             "that is not running");
  p.state = ClockParticipant::State::Sleeping;
  p.wake_at_us = now_us_ + us;
  --running_;
  advance_if_idle();
  wait_asleep(lock, p, cancel);
}

void VirtualClock::sleep_on_channel(ClockParticipant& p, SharedChannel& channel, double work_us,
                                    const Cancellation* cancel, ChannelShare share) {
  if (!(work_us > 0)) return;
  FSDP_CHECK(share.priority >= 0 && share.priority < kChannelPriorities,
             "virtual clock: channel priority ", share.priority, " is not 0 or 1");
  std::unique_lock<std::mutex> lock(mutex_);
  FSDP_CHECK(p.state == ClockParticipant::State::Running, "virtual clock: a timed op on a thread "
             "that is not running");
  p.state = ClockParticipant::State::Sleeping;
  p.channel = &channel;
  p.remaining_us = work_us;
  if (share.sharing < 0) share.sharing = channel.sharing;
  if (share.yield < 0) share.yield = share.sharing;
  if (share.lead < 0) share.lead = share.sharing;
  p.share = share;
  ++channel.active_at[share.priority];
  --running_;
  advance_if_idle();
  wait_asleep(lock, p, cancel);
}

void VirtualClock::leave_channel(ClockParticipant& p) {
  if (!p.channel) return;
  --p.channel->active_at[p.share.priority];
  p.channel = nullptr;
}

void VirtualClock::wait_asleep(std::unique_lock<std::mutex>& lock, ClockParticipant& p,
                               const Cancellation* cancel) {
  const auto since = std::chrono::steady_clock::now();
  while (p.state != ClockParticipant::State::Running) {
    try {
      if (cancel) cancel->throw_if_cancelled();
      // Time cannot start before every rank's device exists: a bound on that wait, so a
      // world with a rank that never comes fails instead of hanging.
      const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - since;
      if (hosts_missing_ > 0 && start_timeout_s_ > 0 && waited.count() > start_timeout_s_)
        FSDP_FAIL("virtual clock: simulated time cannot start: ", hosts_missing_,
                  " rank(s) of the world have not made their device after ", start_timeout_s_,
                  " s");
    } catch (...) {
      leave_channel(p);
      p.state = ClockParticipant::State::Running;
      ++running_;
      throw;
    }
    sleepers_cv_.wait_for(lock, kCancelPollInterval);
  }
}

void VirtualClock::settle(ClockParticipant& p, const Cancellation* cancel) {
  std::unique_lock<std::mutex> lock(mutex_);
  FSDP_CHECK(p.state == ClockParticipant::State::Running, "virtual clock: settle on a thread "
             "that is not running");
  p.state = ClockParticipant::State::Settling;
  --running_;
  ++settling_;
  auto resume = [&] {
    p.state = ClockParticipant::State::Running;
    ++running_;
    --settling_;
  };
  while (running_ > 0) {
    if (cancel) {
      try {
        cancel->throw_if_cancelled();
      } catch (...) {
        resume();
        throw;
      }
    }
    sleepers_cv_.wait_for(lock, kCancelPollInterval);
  }
  resume();
}

void VirtualClock::step(ClockParticipant& p) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_ != 1 || p.state != ClockParticipant::State::Running || hosts_missing_ > 0) return;
  --running_;
  advance();
  ++running_;
}

void VirtualClock::advance_if_idle() {
  if (running_ > 0 || hosts_missing_ > 0) return;
  // A settling host asks about the current time first; it is woken to do so.
  if (settling_ > 0) {
    sleepers_cv_.notify_all();
    return;
  }
  advance();
}

void VirtualClock::advance() {
  // When each sleeper would wake at the rates of now (Note [Shared channels]).
  auto wake_time = [this](const ClockParticipant* p) {
    return p->channel ? now_us_ + p->remaining_us * stretch_of(*p) : p->wake_at_us;
  };
  double next = std::numeric_limits<double>::infinity();
  for (const ClockParticipant* p : participants_)
    if (p->state == ClockParticipant::State::Sleeping) next = std::min(next, wake_time(p));
  // Everyone is blocked: nothing can happen at any later time either (a deadlock, which the
  // collective timeout reports), so time stays.
  if (next == std::numeric_limits<double>::infinity()) return;
  next = std::max(now_us_, next);
  // Progress on the channels up to `next`, at the shares of before anyone wakes; a job within
  // rounding of its end ends now.
  std::vector<ClockParticipant*> done;
  for (ClockParticipant* p : participants_) {
    if (p->state != ClockParticipant::State::Sleeping) continue;
    if (p->channel) {
      const double w = wake_time(p);
      p->remaining_us -= (next - now_us_) / stretch_of(*p);
      if (w <= next || p->remaining_us <= 1e-9 * std::max(1.0, next)) done.push_back(p);
    } else if (p->wake_at_us <= next) {
      done.push_back(p);
    }
  }
  now_us_ = next;
  for (ClockParticipant* p : done) {
    if (p->channel) {
      leave_channel(*p);
      p->remaining_us = 0;
    }
    p->state = ClockParticipant::State::Running;
    ++running_;
  }
  sleepers_cv_.notify_all();
}

// ---- ClockedCondition

void ClockedCondition::notify_all() {
  for (ClockParticipant* w : waiters_) w->clock->wake(*w);
  waiters_.clear();
  cv_.notify_all();
}

void ClockedCondition::enlist(ClockParticipant* self) {
  if (!self || std::find(waiters_.begin(), waiters_.end(), self) != waiters_.end()) return;
  waiters_.push_back(self);
  self->clock->block(*self);
}

void ClockedCondition::discharge(ClockParticipant* self) {
  if (!self) return;
  auto it = std::find(waiters_.begin(), waiters_.end(), self);
  if (it != waiters_.end()) waiters_.erase(it);
  self->clock->wake(*self);
}

bool ClockedCondition::wait(std::unique_lock<std::mutex>& lock, const Cancellation* cancel,
                            const std::function<bool()>& done,
                            std::optional<std::chrono::steady_clock::time_point> deadline) {
  ClockParticipant* self = this_thread_participant();
  if (self && !self->clock) self = nullptr;
  try {
    for (;;) {
      if (done()) break;
      if (cancel) cancel->throw_if_cancelled();
      const auto now = std::chrono::steady_clock::now();
      if (deadline && now >= *deadline) {
        discharge(self);
        return false;
      }
      enlist(self);
      auto until = now + kCancelPollInterval;
      if (deadline) until = std::min(until, *deadline);
      cv_.wait_until(lock, until);
    }
  } catch (...) {
    discharge(self);
    throw;
  }
  discharge(self);
  return true;
}

}  // namespace fsdp::cpu
