// The CUDA side of Note [Timeline] (src/runtime/trace_metrics.h): GPU op times measured with events,
// put on the host clock.
//
// Note [CUDA timeline clock]
// When recording starts, an anchor event is recorded on an idle private stream and waited for;
// the host steady_clock reading around that wait (the midpoint) is the anchor's host time.
// cudaEventElapsedTime returns float milliseconds, whose resolution decays with the interval
// (~1 us at 16 s, ~60 us at 1000 s), so long recordings are not measured from the anchor:
// every ~200 ms of host time (checked when an op is recorded) a relay event goes on the same
// idle stream, and relay k's time is relay k-1's plus the (short) interval between them. An
// op's start and end are measured from the last relay recorded before them, a short interval
// again. Durations thus keep event resolution (~0.5 us) however long the recording.
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
  // The wait span runs from the end of the previous op on `stream` (or from this call, if
  // that is later: the stream cannot have been blocked before the wait was issued, which is
  // also where the CPU backend starts its waits) to an event recorded right after
  // cudaStreamWaitEvent, i.e. until the waited-for work is done.
  void record_wait(int stream, cudaStream_t native, int event_id, const char* label);

  void record_host_span(const char* label, double start_us, double end_us);
  void record_memory(double time_us, int64_t bytes);  // thread-safe (alloc/free may race)

  // The caller has synchronized every stream. Converts, clears, and re-anchors if on.
  Timeline take(std::vector<std::string> stream_names);

 private:
  // An event and the relay it is measured from (-1: the anchor).
  struct Mark {
    cudaEvent_t event = nullptr;
    int relay = -1;
  };
  struct PendingOp {
    const char* label = nullptr;
    const char* waited_for = nullptr;
    int stream = -1;
    OpKind kind = OpKind::Kernel;
    Mark start, end;                            // unused for host spans
    double host_start_us = 0, host_end_us = 0;  // host spans; for waits, the issue time
  };
  cudaEvent_t take_event();
  void anchor();
  int current_relay();  // records a new relay when the last one is old
  void grow_stream_tables(int stream);

  bool enabled_ = false;
  cudaStream_t anchor_stream_ = nullptr;
  cudaEvent_t anchor_event_ = nullptr;
  double anchor_host_us_ = 0;
  std::vector<cudaEvent_t> relays_;  // on anchor_stream_, in recording order
  double last_relay_host_us_ = 0;

  std::vector<cudaEvent_t> free_events_;  // timing-enabled, reused after take()
  std::vector<cudaEvent_t> used_events_;
  std::vector<PendingOp> ops_;
  std::vector<Mark> last_end_by_stream_;
  std::vector<const char*> last_label_by_stream_;
  std::vector<const char*> label_by_event_;

  std::mutex memory_mutex_;
  std::vector<MemSample> memory_;
};

}  // namespace fsdp::cuda
