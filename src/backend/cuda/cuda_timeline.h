// The CUDA side of Note [Timeline] (src/runtime/trace.h): GPU op times measured with events,
// put on the host clock.
//
// Note [CUDA timeline clock]
// When recording starts, an anchor event is recorded on an idle private stream and waited for;
// the host steady_clock reading around that wait (the midpoint) is the anchor's host time.
// An op's start is anchor_host + elapsed(anchor, start event), its end is start +
// elapsed(start, end), so durations keep full event resolution (~0.5 us). cudaEventElapsedTime
// returns float milliseconds: the start offset keeps ~1 us resolution for ~16 s after the
// anchor, and take() re-anchors, so take the timeline at least that often (per traced step).
// Host times are steady_clock (CLOCK_MONOTONIC) microseconds, the same clock in every
// process of the machine, so the ranks' timelines line up.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <string>
#include <vector>

#include "fsdp/device.h"

namespace fsdp::cuda {

class TimelineRecorder {
 public:
  TimelineRecorder() = default;
  ~TimelineRecorder();
  TimelineRecorder(const TimelineRecorder&) = delete;
  TimelineRecorder& operator=(const TimelineRecorder&) = delete;

  static double host_now_us();

  bool enabled() const { return enabled_; }
  void enable(bool on);

  // Brackets one op: begin() records its start event on `native` and returns a token for
  // end(). end() never throws (it runs in destructors); an op whose end failed is dropped.
  int begin(int stream, cudaStream_t native, const char* label, OpKind kind);
  void end(int token, cudaStream_t native) noexcept;

  // For Wait ops: which op the waited event followed (the last op on its stream at record).
  void note_event_recorded(int event_id, int stream);
  // The wait span runs from the end of the previous op on `stream` to an event recorded
  // right after cudaStreamWaitEvent, i.e. until the waited-for work is done.
  void record_wait(int stream, cudaStream_t native, int event_id, const char* label);

  void record_host_span(const char* label, double start_us, double end_us);
  void record_memory(double time_us, int64_t bytes);  // thread-safe (alloc/free may race)

  // The caller has synchronized every stream. Converts, clears, and re-anchors if on.
  Timeline take(std::vector<std::string> stream_names);

 private:
  struct PendingOp {
    const char* label = nullptr;
    const char* waited_for = nullptr;
    int stream = -1;
    OpKind kind = OpKind::Kernel;
    cudaEvent_t start = nullptr, end = nullptr;  // null start: a host span
    double host_start_us = 0, host_end_us = 0;
  };
  cudaEvent_t take_event();
  void anchor();
  void grow_stream_tables(int stream);

  bool enabled_ = false;
  cudaStream_t anchor_stream_ = nullptr;
  cudaEvent_t anchor_event_ = nullptr;
  double anchor_host_us_ = 0;

  std::vector<cudaEvent_t> free_events_;  // timing-enabled, reused after take()
  std::vector<cudaEvent_t> used_events_;
  std::vector<PendingOp> ops_;
  std::vector<cudaEvent_t> last_end_by_stream_;
  std::vector<const char*> last_label_by_stream_;
  std::vector<const char*> label_by_event_;

  std::mutex memory_mutex_;
  std::vector<MemSample> memory_;
};

}  // namespace fsdp::cuda
