// Stream workers, sticky errors, the timeline sink and chaos delays of the CPU backend.
#include "backend/cpu/cpu_stream.h"

#include <exception>
#include <utility>

#include "fsdp/error.h"

namespace fsdp::cpu {

namespace {
// The worker that runs on this thread, if any: chaos pauses inside collectives and the
// task clock reset need it without threading it through every call.
thread_local ChaosDelay* t_chaos = nullptr;
thread_local double* t_task_start = nullptr;
thread_local double* t_task_end = nullptr;
thread_local const WorldState* t_world = nullptr;

// splitmix64: spreads (seed, rank, stream) into well-separated generator seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

// ---- TimelineRecorder

void TimelineRecorder::add_op(const char* label, int stream, OpKind kind, double start_us,
                              double end_us, const char* waited_for) {
  TimelineOp op;
  op.label = label ? label : "";
  op.stream = stream;
  op.kind = kind;
  op.start_us = start_us;
  op.end_us = end_us;
  if (waited_for) op.waited_for = waited_for;
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.push_back(std::move(op));
}

void TimelineRecorder::add_memory(double time_us, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  memory_.push_back({time_us, bytes});
}

Timeline TimelineRecorder::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  Timeline out;
  out.ops = std::exchange(ops_, {});
  out.memory = std::exchange(memory_, {});
  return out;
}

// ---- chaos

ChaosDelay::ChaosDelay(const WorldState& world, int rank, int stream_id,
                       const Cancellation* cancel)
    : world_(world),
      cancel_(cancel),
      on_(world.options.chaos && world.options.chaos_max_us > 0),
      rng_(mix(mix(mix(world.options.chaos_seed) ^ static_cast<uint64_t>(rank)) ^
               static_cast<uint64_t>(stream_id))),
      micros_(0, world.options.chaos_max_us > 0 ? world.options.chaos_max_us : 0) {}

void ChaosDelay::pause() {
  if (!on_) return;
  world_.pass_time(micros_(rng_), cancel_);
}

void chaos_pause_on_this_thread() {
  if (t_chaos) t_chaos->pause();
}

void restart_task_clock() {
  if (t_task_start && t_world) *t_task_start = t_world->now_us();
}

void stop_task_clock() {
  if (t_task_end && t_world) *t_task_end = t_world->now_us();
}

// ---- StreamWorker

StreamWorker::StreamWorker(StreamHost host, int id, std::string name)
    : host_(std::move(host)),
      id_(id),
      name_(std::move(name)),
      chaos_(*host_.world, host_.rank, id, host_.cancellation),
      thread_(start()) {}

std::thread StreamWorker::start() {
  // A participant from before its thread runs: until it first waits for work, simulated time
  // must not pass it by.
  if (host_.world->clock) host_.world->clock->join(participant_, /*host=*/false);
  return std::thread([this] { loop(); });
}

StreamWorker::~StreamWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    work_cv_.notify_all();
  }
  thread_.join();
  if (host_.world->clock) host_.world->clock->leave(participant_);
}

void StreamWorker::enqueue(Task task) {
  if (!task.bookkeeping && task.kind != OpKind::Wait)
    last_label_.store(task.label, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
    ++enqueued_;
    work_cv_.notify_all();
  }
}

void StreamWorker::wait_idle(bool cancellable) {
  std::unique_lock<std::mutex> lock(mutex_);
  const int64_t target = enqueued_;
  idle_cv_.wait(lock, cancellable ? host_.cancellation : nullptr,
                [&] { return finished_ >= target; });
}

void StreamWorker::loop() {
  // Errors raised by this stream's work name the rank and device it works for.
  ThreadIdentity& identity = this_thread_identity();
  identity.rank = host_.rank;
  identity.device = host_.device_name;
  t_chaos = &chaos_;
  t_world = host_.world.get();
  if (host_.world->clock) set_this_thread_participant(&participant_);
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Not cancellable: the worker stops only through stopping_, after draining its queue.
      work_cv_.wait(lock, nullptr, [&] { return !queue_.empty() || stopping_; });
      // On shutdown the queue still drains: its bookkeeping releases memory.
      if (queue_.empty()) break;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    run_one(task);
    task = Task{};  // drop captured buffers before reporting progress
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++finished_;
      idle_cv_.notify_all();
    }
  }
  t_chaos = nullptr;
  t_world = nullptr;
  set_this_thread_participant(nullptr);
}

void StreamWorker::run_one(Task& task) {
  try {
    chaos_.pause();
  } catch (const std::exception& e) {
    host_.error->set(e.what());  // cancelled while paused; the error says why
  }
  // After a failure the stream keeps draining but skips the work, as a CUDA stream in a
  // sticky error state does; synchronize reports the failure.
  if (!task.bookkeeping && host_.error->is_set()) return;
  const bool record = !task.bookkeeping && host_.timeline->enabled();
  double start = record ? host_.world->now_us() : 0.0;
  double end = -1.0;  // set by stop_task_clock, else taken when the task returns
  if (record) {
    t_task_start = &start;
    t_task_end = &end;
  }
  try {
    task.run();
  } catch (const std::exception& e) {
    host_.error->set(e.what());
  } catch (...) {
    host_.error->set("[rank " + std::to_string(host_.rank) + "] unknown exception on stream '" +
                     name_ + "'");
  }
  t_task_start = nullptr;
  t_task_end = nullptr;
  if (record) {
    if (end < 0) end = host_.world->now_us();
    host_.timeline->add_op(task.label, id_, task.kind, start, end, task.waited_for);
  }
}

}  // namespace fsdp::cpu
