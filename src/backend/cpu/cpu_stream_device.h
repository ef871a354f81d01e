// The part of a device that the CPU backend and the simulation backend share: streams that are
// worker threads, events with CUDA's semantics by generation, the sticky error, labels and
// the timeline, all on the world's clock (the virtual one, Note [Virtual clock], when it has
// one). See Note [CPU backend] in cpu_device.cpp; what a derived device adds is its memory
// and its ops, each enqueued with enqueue().
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backend/cpu/cpu_stream.h"
#include "backend/cpu/cpu_world_state.h"
#include "fsdp/device.h"

namespace fsdp::cpu {

constexpr int kMaxStreams = 64;

class StreamDevice : public Device {
 public:
  // `prefix` names the device: prefix + ":" + rank.
  StreamDevice(std::shared_ptr<WorldState> world, int rank, std::string prefix);
  ~StreamDevice() override;

  std::string name() const override;

  Stream create_stream(const std::string& name, StreamPriority priority) override;
  Event create_event() override;
  void destroy_event(Event e) override;
  void record_event(Event e, Stream s) override;
  void wait_event(Stream s, Event e) override;
  bool query_event(Event e) override;
  void synchronize_event(Event e) override;
  void synchronize_stream(Stream s) override;
  void synchronize() override;
  void wait_until_drained() noexcept override;

  void set_label(const char* label) override;
  void enable_timeline(bool on) override;
  Timeline take_timeline() override;
  double now_us() const override;
  void record_host_span(const char* label, double start_us, double end_us) override;

  // ---- for the communicators of these backends
  int rank() const { return rank_; }
  const std::shared_ptr<WorldState>& world() const { return world_; }
  const Cancellation& cancellation() const { return cancellation_; }
  bool failed() const { return error_.is_set(); }
  // Enqueues `run` on s under the current label.
  void enqueue(Stream s, OpKind kind, std::function<void()> run);
  // The same for bookkeeping (Task::bookkeeping): runs even after an error, off the timeline.
  void enqueue_bookkeeping(Stream s, std::function<void()> run);
  // The label set_label last gave (the ops enqueued now carry it).
  const char* current_label() const { return label_.load(std::memory_order_relaxed); }
  // The priority create_stream gave s (the CPU backend runs every stream alike; the
  // simulation backend's kernels share the device by it, Note [Shared channels]).
  StreamPriority stream_priority(Stream s);
  // Whether the calling thread is the one that drives this device (its host).
  bool on_host_thread() const;
  // The host's participant in the world's clock (Note [Virtual clock]).
  ClockParticipant& host_participant() { return host_participant_; }

 protected:
  StreamWorker& worker(Stream s);
  // Called by synchronize() once every stream is idle; a non-empty message becomes the
  // device's sticky error (the CPU device checks its quarantine here).
  virtual std::string check_after_synchronize() { return {}; }
  // A memory sample for the timeline, when it records.
  void sample_memory(int64_t current_bytes);
  bool timeline_enabled() const { return timeline_.enabled(); }
  // Drains and joins every stream. A derived device calls it first in its destructor, so no
  // task outlives the state it uses; idempotent.
  void stop_streams();
  StickyError& error() { return error_; }

 private:
  struct EventSlot {
    bool live = false;
    int64_t recorded = 0;              // generations recorded so far (monotonic, across reuse)
    int64_t created_at = 0;            // `recorded` when the current owner created it
    std::set<int64_t> pending;         // recorded generations whose point is not reached yet
    const char* last_label = nullptr;  // the op the latest recorded generation follows
  };
  EventSlot& slot(Event e);  // event_mutex_ held

  const std::shared_ptr<WorldState> world_;
  const int rank_;
  const std::string prefix_;
  std::atomic<bool> shutting_down_{false};
  StickyError error_;
  const Cancellation cancellation_;
  TimelineRecorder timeline_;
  std::atomic<const char*> label_{nullptr};

  // The thread that made the device drives it; see Note [Virtual clock].
  ClockParticipant host_participant_;
  bool stopped_ = false;

  std::mutex event_mutex_;
  ClockedCondition event_cv_;
  std::vector<EventSlot> events_;
  std::vector<int> free_event_ids_;

  // Fixed-size so that enqueue can look a stream up without a lock while another thread
  // creates one; num_streams_ publishes a new entry after it is built.
  std::mutex stream_create_mutex_;
  std::array<std::unique_ptr<StreamWorker>, kMaxStreams> streams_;
  std::array<StreamPriority, kMaxStreams> priorities_{};
  std::atomic<int> num_streams_{0};
};

}  // namespace fsdp::cpu
