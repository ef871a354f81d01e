// Note [CPU backend]
// The CPU backend runs a whole launch in one process so that the engine's stream, event and
// memory discipline can be tested without a GPU, and tested harder than a GPU would: each
// rank is a thread of the launcher, and each stream of a rank is a worker thread running a
// FIFO queue of std::function tasks (cpu_stream.h). Enqueuing returns at once; work really
// runs later and streams really run concurrently, so a missing wait_event is a real race.
//
//  - Events have CUDA semantics by generation. record_event bumps the event's recorded
//    generation at call time and enqueues a task that marks that generation reached;
//    wait_event captures the generation at call time and enqueues a task that blocks until it
//    is reached (a never-recorded event makes the wait a no-op). Each slot keeps the set of
//    generations not reached yet, so records on two streams that finish out of order are
//    still exact, and ids are reused with generations that never go back.
//  - Memory (cpu_allocator.h): counters change when alloc/free are called, so the engine's
//    memory tests are exact and timing-independent. The release itself is a task on the
//    free's stream (stream-ordered). In checked mode the task fills the memory with 0xFF
//    (NaN in fp32 and bf16) and keeps it quarantined, so a stream that reads memory freed
//    too early computes NaN; fresh allocations start as NaN too, so reads of never-written
//    memory are caught the same way. Writes into freed memory are caught by checking that
//    the poison is intact when a block leaves quarantine and, for every block still in it,
//    at each device-wide synchronize; the error names the allocation's tag and size.
//  - Errors: an exception in a task (a collective mismatch, a bad label index, an abort)
//    becomes the device's sticky error. Streams keep draining but skip work, except the
//    bookkeeping tasks (event completion, memory release) that others may depend on, and
//    every synchronize rethrows the error.
//  - Abort and shutdown: every blocking wait polls the world's abort flag and its device's
//    shutdown flag (kCancelPollInterval), so CpuWorld::abort wakes ranks blocked in a
//    collective or an event wait, and destroying a device never hangs on a wait that can no
//    longer be satisfied; worker threads are always joined.
//  - Chaos mode: a random sleep before every task and between the phases of a collective,
//    from a generator per stream seeded by (seed, rank, stream id). It shakes out schedules
//    that are only correct under lucky timing while keeping each run's delays reproducible.
//  - Virtual clock (CpuOptions::virtual_clock): spins, the simulated link and chaos delays
//    advance simulated time instead of sleeping, and the streams of all ranks stay in step
//    through it, so timings are exact on any machine; see Note [Virtual clock] in
//    cpu_virtual_clock.cpp.
//  - Collectives time out (CpuOptions::collective_timeout_s, wall time) rather than hang.
//  - Timeline: tasks capture the device's sticky label when enqueued; when recording is on,
//    each task's run time is recorded on its stream's track, measured on a clock whose origin
//    is the world's (or on the virtual clock), so the tracks of all ranks line up.
//  - Stream priority is accepted and ignored: the OS schedules the worker threads.
//  - Collectives are stream tasks too; see Note [CPU collectives] in cpu_comm.cpp.
#include "backend/cpu/cpu_device.h"

#include <cstdlib>
#include <new>
#include <utility>

#include "backend/cpu/cpu_kernels.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

CpuDevice::CpuDevice(std::shared_ptr<WorldState> world, int rank)
    : world_(std::move(world)),
      rank_(rank),
      cancellation_(*world_, shutting_down_, error_),
      allocator_(world_->options.checked, world_->options.quarantine_bytes,
                 world_->options.memory_capacity_bytes, "cpu:" + std::to_string(rank)) {
  kernels::configure_blas_once();
  if (world_->clock) {
    const ClockParticipant* other = this_thread_participant();
    FSDP_CHECK(other == nullptr || other->clock != world_->clock.get(),
               "with the virtual clock each device needs its own host thread, and this thread "
               "already drives another device of the world (or is one of its streams)");
    world_->clock->join(host_participant_, /*host=*/true);
    set_this_thread_participant(&host_participant_);
  }
}

CpuDevice::~CpuDevice() {
  // The host issues nothing more: simulated time need not wait for it while streams drain.
  if (world_->clock) {
    world_->clock->leave(host_participant_);
    if (this_thread_participant() == &host_participant_) set_this_thread_participant(nullptr);
  }
  // Waits that can no longer be satisfied now fail instead of blocking the join below.
  shutting_down_.store(true, std::memory_order_release);
  for (int i = num_streams_.load(std::memory_order_acquire) - 1; i >= 0; --i) streams_[i].reset();
}

std::string CpuDevice::name() const {
  return "cpu:" + std::to_string(rank_);
}

// ---- streams

Stream CpuDevice::create_stream(const std::string& name, StreamPriority /*priority*/) {
  std::lock_guard<std::mutex> lock(stream_create_mutex_);
  const int id = num_streams_.load(std::memory_order_relaxed);
  FSDP_CHECK(id < kMaxStreams, "too many streams on ", this->name(), " (at most ", kMaxStreams,
             ")");
  StreamHost host{rank_, world_, &error_, &timeline_, &cancellation_};
  streams_[id] = std::make_unique<StreamWorker>(std::move(host), id, name);
  num_streams_.store(id + 1, std::memory_order_release);
  return Stream{id};
}

StreamWorker& CpuDevice::worker(Stream s) {
  const int n = num_streams_.load(std::memory_order_acquire);
  FSDP_CHECK(s.id >= 0 && s.id < n, "stream ", s.id, " does not exist on ", name(), " (it has ", n,
             ")");
  return *streams_[s.id];
}

void CpuDevice::enqueue(Stream s, OpKind kind, std::function<void()> run) {
  StreamWorker& w = worker(s);
  Task task;
  task.run = std::move(run);
  task.label = label_.load(std::memory_order_relaxed);
  task.kind = kind;
  w.enqueue(std::move(task));
}

void CpuDevice::synchronize_stream(Stream s) {
  worker(s).wait_idle();
  error_.rethrow_if_set();
}

void CpuDevice::synchronize() {
  const int n = num_streams_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) streams_[i]->wait_idle();
  // Blocks still in quarantine are checked here too, so that a write after free is caught
  // in a run too short to cycle the quarantine.
  const std::string written = allocator_.check_quarantine();
  if (!written.empty()) error_.set(detail::concat("[rank ", rank_, " ", name(), "] ", written));
  error_.rethrow_if_set();
}

// ---- events

CpuDevice::EventSlot& CpuDevice::slot(Event e) {
  FSDP_CHECK(e.id >= 0 && e.id < static_cast<int>(events_.size()) && events_[e.id].live, "event ",
             e.id, " does not exist on ", name(), " (never created, or destroyed)");
  return events_[e.id];
}

Event CpuDevice::create_event() {
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

void CpuDevice::destroy_event(Event e) {
  std::lock_guard<std::mutex> lock(event_mutex_);
  // Generations still pending complete normally; waits already enqueued keep working.
  slot(e).live = false;
  free_event_ids_.push_back(e.id);
}

void CpuDevice::record_event(Event e, Stream s) {
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

void CpuDevice::wait_event(Stream s, Event e) {
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

bool CpuDevice::query_event(Event e) {
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

void CpuDevice::synchronize_event(Event e) {
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

// ---- memory

void* CpuDevice::alloc(size_t bytes, Stream s, MemTag tag) {
  worker(s);  // validates the stream; the memory itself is usable at once
  void* ptr = allocator_.allocate(bytes, tag);
  sample_memory();
  return ptr;
}

void CpuDevice::free(void* ptr, Stream s) {
  if (ptr == nullptr) return;
  StreamWorker& w = worker(s);
  const core::AllocationLedger::Entry entry = allocator_.forget(ptr);
  sample_memory();
  Task task;
  task.bookkeeping = true;
  task.run = [this, ptr, entry] { allocator_.release(ptr, entry); };
  w.enqueue(std::move(task));
}

MemStats CpuDevice::memory_stats() const {
  return allocator_.stats();
}
void CpuDevice::reset_peak_memory() {
  allocator_.reset_peak();
}

void* CpuDevice::alloc_host(size_t bytes) {
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

void CpuDevice::free_host(void* ptr) {
  std::free(ptr);
}

void CpuDevice::sample_memory() {
  if (timeline_.enabled()) timeline_.add_memory(now_us(), allocator_.current_bytes());
}

// ---- labels and timeline

void CpuDevice::set_label(const char* label) {
  label_.store(label, std::memory_order_relaxed);
}
void CpuDevice::enable_timeline(bool on) {
  timeline_.set_enabled(on);
}
double CpuDevice::now_us() const {
  return world_->now_us();
}

Timeline CpuDevice::take_timeline() {
  synchronize();
  Timeline out = timeline_.take();
  const int n = num_streams_.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) out.stream_names.push_back(streams_[i]->name());
  return out;
}

void CpuDevice::record_host_span(const char* label, double start_us, double end_us) {
  if (timeline_.enabled()) timeline_.add_op(label, -1, OpKind::Host, start_us, end_us, nullptr);
}

}  // namespace fsdp::cpu
