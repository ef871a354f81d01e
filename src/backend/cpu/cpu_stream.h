// A CPU "stream": one worker thread running a FIFO queue of tasks. See Note [CPU backend]
// in cpu_device.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_world_state.h"
#include "fsdp/device.h"

namespace fsdp::cpu {

// Thread-safe sink for timeline records. Recording is off by default, and while it is off
// the only cost on the hot path is one relaxed atomic load.
class TimelineRecorder {
 public:
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  void add_op(const char* label, int stream, OpKind kind, double start_us, double end_us,
              const char* waited_for);
  void add_memory(double time_us, int64_t bytes);
  // Moves out what was recorded; stream_names is left for the device to fill.
  Timeline take();

 private:
  std::atomic<bool> enabled_{false};
  std::mutex mutex_;
  std::vector<TimelineOp> ops_;
  std::vector<MemSample> memory_;
};

struct Task {
  std::function<void()> run;
  const char* label = nullptr;  // the device's label when the op was enqueued
  OpKind kind = OpKind::Kernel;
  const char* waited_for = nullptr;  // Wait tasks: the label before the awaited record
  // Bookkeeping tasks (event completion, stream-ordered release of memory) run even after
  // an error, so waiters are not left hanging and memory is not leaked; they are also left
  // out of the timeline.
  bool bookkeeping = false;
};

// What a stream's worker shares with its device.
struct StreamHost {
  int rank = 0;
  std::shared_ptr<WorldState> world;
  StickyError* error = nullptr;
  TimelineRecorder* timeline = nullptr;
  const Cancellation* cancellation = nullptr;
  std::string device_name;  // for the errors its work raises
};

// Random delays for chaos mode, from a generator seeded by (seed, rank, stream) so a run's
// delays are reproducible. They are simulated under the virtual clock.
class ChaosDelay {
 public:
  ChaosDelay(const WorldState& world, int rank, int stream_id, const Cancellation* cancel);
  void pause();

 private:
  const WorldState& world_;
  const Cancellation* cancel_;
  bool on_;
  std::mt19937_64 rng_;
  std::uniform_int_distribution<int> micros_;
};

// Chaos pause for whichever stream the calling thread serves; a no-op on other threads.
// Collectives call it between their rendezvous phases.
void chaos_pause_on_this_thread();
// Resets the start of the current task's timeline interval to now. A collective calls it
// once its turn on the communicator has come, so the time it queued behind the previous
// collective of the communicator is not counted as collective time.
void restart_task_clock();
// Ends the current task's timeline interval now. A collective calls it just before it lets
// the communicator's next collective go, so the two intervals never appear to overlap.
void stop_task_clock();

class StreamWorker {
 public:
  StreamWorker(StreamHost host, int id, std::string name);
  ~StreamWorker();  // runs what is queued, then joins
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  int id() const { return id_; }
  const std::string& name() const { return name_; }
  void enqueue(Task task);
  // Blocks until every task enqueued before the call has run.
  // Returns when every task enqueued so far has finished. Cancellable (abort, shutdown)
  // unless `cancellable` is false: the wait of Note [Draining before freeing host memory].
  void wait_idle(bool cancellable = true);
  // The label of the last op (not bookkeeping or wait) enqueued here; host side.
  const char* last_label() const { return last_label_.load(std::memory_order_relaxed); }

 private:
  std::thread start();
  void loop();
  void run_one(Task& task);

  StreamHost host_;
  const int id_;
  const std::string name_;
  ChaosDelay chaos_;
  ClockParticipant participant_;  // joined to the world's virtual clock, if it has one
  std::atomic<const char*> last_label_{nullptr};

  std::mutex mutex_;
  ClockedCondition work_cv_;  // the worker waits here for tasks
  ClockedCondition idle_cv_;  // synchronizers wait here for progress
  std::deque<Task> queue_;
  int64_t enqueued_ = 0;
  int64_t finished_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after everything it uses is built
};

}  // namespace fsdp::cpu
