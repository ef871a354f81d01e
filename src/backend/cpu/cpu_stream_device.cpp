// Streams, events, labels and the timeline of the CPU and simulation devices
// (cpu_stream_device.h; Note [CPU backend] in cpu_device.cpp).
#include "backend/cpu/cpu_stream_device.h"

#include <utility>

#include "fsdp/error.h"

namespace fsdp::cpu {

StreamDevice::StreamDevice(std::shared_ptr<WorldState> world, int rank, std::string prefix)
    : world_(std::move(world)),
      rank_(rank),
      prefix_(std::move(prefix)),
      cancellation_(*world_, shutting_down_, error_) {
  if (world_->clock) {
    const ClockParticipant* other = this_thread_participant();
    FSDP_CHECK(other == nullptr || other->clock != world_->clock.get(),
               "with the virtual clock each device needs its own host thread, and this thread "
               "already drives another device of the world (or is one of its streams)");
    world_->clock->join(host_participant_, /*host=*/true);
    set_this_thread_participant(&host_participant_);
  }
}

StreamDevice::~StreamDevice() { stop_streams(); }

void StreamDevice::stop_streams() {
  if (stopped_) return;
  stopped_ = true;
  // The host issues nothing more: simulated time need not wait for it while streams drain.
  if (world_->clock) {
    world_->clock->leave(host_participant_);
    if (this_thread_participant() == &host_participant_) set_this_thread_participant(nullptr);
  }
  // Waits that can no longer be satisfied now fail instead of blocking the join below.
  shutting_down_.store(true, std::memory_order_release);
  for (int i = num_streams_.load(std::memory_order_acquire) - 1; i >= 0; --i) streams_[i].reset();
}

std::string StreamDevice::name() const {
  return prefix_ + ":" + std::to_string(rank_);
}

bool StreamDevice::on_host_thread() const {
  return this_thread_participant() == &host_participant_;
}

// ---- streams

Stream StreamDevice::create_stream(const std::string& name, StreamPriority priority) {
  std::lock_guard<std::mutex> lock(stream_create_mutex_);
  const int id = num_streams_.load(std::memory_order_relaxed);
  FSDP_CHECK(id < kMaxStreams, "too many streams on ", this->name(), " (at most ", kMaxStreams,
             ")");
  StreamHost host{rank_, world_, &error_, &timeline_, &cancellation_, this->name()};
  streams_[id] = std::make_unique<StreamWorker>(std::move(host), id, name);
  priorities_[id] = priority;
  num_streams_.store(id + 1, std::memory_order_release);
  return Stream{id};
}

StreamWorker& StreamDevice::worker(Stream s) {
  const int n = num_streams_.load(std::memory_order_acquire);
  FSDP_CHECK(s.id >= 0 && s.id < n, "stream ", s.id, " does not exist on ", name(), " (it has ", n,
             ")");
  return *streams_[s.id];
}

StreamPriority StreamDevice::stream_priority(Stream s) {
  worker(s);  // validates the stream
  return priorities_[s.id];
}

void StreamDevice::enqueue(Stream s, OpKind kind, std::function<void()> run) {
  StreamWorker& w = worker(s);
  Task task;
  task.run = std::move(run);
  task.label = label_.load(std::memory_order_relaxed);
  task.kind = kind;
  w.enqueue(std::move(task));
}

void StreamDevice::synchronize_stream(Stream s) {
  worker(s).wait_idle();
  error_.rethrow_if_set();
}

void StreamDevice::enqueue_bookkeeping(Stream s, std::function<void()> run) {
  Task task;
  task.bookkeeping = true;
  task.run = std::move(run);
  worker(s).enqueue(std::move(task));
}

void StreamDevice::synchronize() {
  const int n = num_streams_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) streams_[i]->wait_idle();
  const std::string failure = check_after_synchronize();
  if (!failure.empty()) error_.set(detail::concat("[rank ", rank_, " ", name(), "] ", failure));
  error_.rethrow_if_set();
}

// Note [Draining before freeing host memory]
// Destructors of objects whose host buffers queued work writes (StepReader's readback, the
// offloaded optimizer's slots, the collective check's fingerprints) wait for that work through
// synchronize_in_destructor before they free. They run while an error unwinds the stack,
// typically after the world was aborted, and an abort cancels synchronize()'s wait at once
// while a task blocked in a collective notices it only at its next poll, and the tasks behind
// it run or are skipped after that. Freeing then let a copy_to_host land in freed heap memory
// (glibc's "unaligned fastbin chunk" abort, seldom). So the destructor's wait is not
// cancellable: it ends when the queues are empty, which they become, since every blocking task
// still polls the abort (and the collective timeout) itself.
void StreamDevice::wait_until_drained() noexcept {
  const int n = num_streams_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    try {
      streams_[i]->wait_idle(/*cancellable=*/false);
    } catch (...) {  // the virtual clock's bookkeeping only; the work reports its own errors
    }
  }
}

// ---- events

StreamDevice::EventSlot& StreamDevice::slot(Event e) {
  FSDP_CHECK(e.id >= 0 && e.id < static_cast<int>(events_.size()) && events_[e.id].live, "event ",
             e.id, " does not exist on ", name(), " (never created, or destroyed)");
  return events_[e.id];
}

Event StreamDevice::create_event() {
  std::lock_guard<std::mutex> lock(event_mutex_);
  int id;
  if (!free_event_ids_.empty()) {
    id = free_event_ids_.back();
    free_event_ids_.pop_back();
  } else {
    id = static_cast<int>(events_.size());
    events_.emplace_back();
  }
  EventSlot& s = events_[id];
  s.live = true;
  s.created_at = s.recorded;  // a reused id starts out never recorded
  s.last_label = nullptr;
  return Event{id};
}

void StreamDevice::destroy_event(Event e) {
  std::lock_guard<std::mutex> lock(event_mutex_);
  // Generations still pending complete normally; waits already enqueued keep working.
  slot(e).live = false;
  free_event_ids_.push_back(e.id);
}

void StreamDevice::record_event(Event e, Stream s) {
  StreamWorker& w = worker(s);
  int64_t generation;
  {
    std::lock_guard<std::mutex> lock(event_mutex_);
    EventSlot& sl = slot(e);
    generation = ++sl.recorded;
    sl.pending.insert(generation);
    sl.last_label = w.last_label();
  }
  Task task;
  task.bookkeeping = true;
  task.run = [this, id = e.id, generation] {
    std::lock_guard<std::mutex> lock(event_mutex_);
    events_[id].pending.erase(generation);
    event_cv_.notify_all();
  };
  w.enqueue(std::move(task));
}

void StreamDevice::wait_event(Stream s, Event e) {
  StreamWorker& w = worker(s);
  int64_t generation;
  const char* waited_for;
  {
    std::lock_guard<std::mutex> lock(event_mutex_);
    EventSlot& sl = slot(e);
    if (sl.recorded == sl.created_at) return;  // never recorded: nothing to wait for
    generation = sl.recorded;
    waited_for = sl.last_label;
  }
  Task task;
  task.kind = OpKind::Wait;
  task.label = label_.load(std::memory_order_relaxed);
  task.waited_for = waited_for;
  task.run = [this, id = e.id, generation] {
    std::unique_lock<std::mutex> lock(event_mutex_);
    event_cv_.wait(lock, &cancellation_,
                   [&] { return events_[id].pending.count(generation) == 0; });
  };
  w.enqueue(std::move(task));
}

bool StreamDevice::query_event(Event e) {
  // On the virtual clock the answer is for the current simulated time once everything due
  // then has happened, and a "no" lets time move on, so that polling neither races the
  // streams nor holds time still (Note [Virtual clock]).
  const bool simulated = world_->clock && this_thread_participant() == &host_participant_;
  if (simulated) world_->clock->settle(host_participant_, &cancellation_);
  bool reached;
  {
    std::lock_guard<std::mutex> lock(event_mutex_);
    EventSlot& sl = slot(e);
    reached = sl.recorded == sl.created_at || sl.pending.count(sl.recorded) == 0;
  }
  if (simulated && !reached) world_->clock->step(host_participant_);
  return reached;
}

void StreamDevice::synchronize_event(Event e) {
  std::unique_lock<std::mutex> lock(event_mutex_);
  EventSlot& sl = slot(e);
  if (sl.recorded != sl.created_at) {
    const int64_t generation = sl.recorded;
    const int id = e.id;
    event_cv_.wait(lock, &cancellation_,
                   [&] { return events_[id].pending.count(generation) == 0; });
  }
  lock.unlock();
  error_.rethrow_if_set();
}

// ---- memory samples

void StreamDevice::sample_memory(int64_t current_bytes) {
  if (timeline_.enabled()) timeline_.add_memory(now_us(), current_bytes);
}

// ---- labels and timeline

void StreamDevice::set_label(const char* label) {
  label_.store(label, std::memory_order_relaxed);
}
void StreamDevice::enable_timeline(bool on) {
  timeline_.set_enabled(on);
}
double StreamDevice::now_us() const {
  return world_->now_us();
}

Timeline StreamDevice::take_timeline() {
  synchronize();
  Timeline out = timeline_.take();
  const int n = num_streams_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) out.stream_names.push_back(streams_[i]->name());
  return out;
}

void StreamDevice::record_host_span(const char* label, double start_us, double end_us) {
  if (timeline_.enabled()) timeline_.add_op(label, -1, OpKind::Host, start_us, end_us, nullptr);
}

}  // namespace fsdp::cpu
