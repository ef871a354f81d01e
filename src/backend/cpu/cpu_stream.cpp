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

ChaosDelay::ChaosDelay(const CpuOptions& options, int rank, int stream_id)
    : on_(options.chaos && options.chaos_max_us > 0),
      rng_(mix(mix(mix(options.chaos_seed) ^ static_cast<uint64_t>(rank)) ^
               static_cast<uint64_t>(stream_id))),
      micros_(0, options.chaos_max_us > 0 ? options.chaos_max_us : 0) {}

void ChaosDelay::pause() {
  if (!on_) return;
  const int us = micros_(rng_);
  if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
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
      chaos_(host_.world->options, host_.rank, id),
      thread_([this] { loop(); }) {}

StreamWorker::~StreamWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void StreamWorker::enqueue(Task task) {
  if (!task.bookkeeping && task.kind != OpKind::Wait)
    last_label_.store(task.label, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
    ++enqueued_;
  }
  work_cv_.notify_one();
}

void StreamWorker::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  const int64_t target = enqueued_;
  wait_unless_cancelled(idle_cv_, lock, *host_.cancellation, [&] { return finished_ >= target; });
}

void StreamWorker::loop() {
  // Errors raised by this stream's work name the rank and device it works for.
  ThreadIdentity& identity = this_thread_identity();
  identity.rank = host_.rank;
  identity.device = "cpu:" + std::to_string(host_.rank);
  t_chaos = &chaos_;
  t_world = host_.world.get();
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
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
    }
    idle_cv_.notify_all();
  }
  t_chaos = nullptr;
  t_world = nullptr;
}

void StreamWorker::run_one(Task& task) {
  chaos_.pause();
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
