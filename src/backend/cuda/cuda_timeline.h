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
//
// Note [Timeline inside CUDA graphs]
// While a step is captured with the timeline on, each op's start and end events are recorded
// with cudaEventRecordExternal: they become event-record nodes of the graph, and every replay
// records them again. The captured ops (label, stream, kind, events) are kept as the graph's
// op list. When the graph is replayed with the timeline on, a copy of that list joins the
// pending ops, measured from the relay current at the launch (the relay is recorded before it,
// so every interval is short and positive). The events are the graph's own, so a replay
// overwrites the previous replay's times: a replay whose ops were not yet taken first resolves
// them (waiting for their end events), and so does destroying the graph. The trainer takes the
// timeline after every traced step, so it never waits there. A wait inside the graph starts at
// the previous op of its stream in the graph (or at the graph's start event) and ends at an
// event recorded after it, as an eager wait does, less the host's issue time, which a replay
// does not have. Memory samples are not recorded inside a graph (its memory is the graph's).
#pragma once

#include <cuda_runtime.h>

#include <map>
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
  // end(), or -1 when the op is not timed. end() never throws (it runs in destructors); an op
  // whose end failed is dropped. Under a capture begun with the timeline on, the events are
  // the graph's (Note [Timeline inside CUDA graphs]).
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

  // Note [Timeline inside CUDA graphs]. begin_capture calls begin_graph once the capture has
  // begun on `origin` (it records the graph's start event); end_capture calls end_graph with
  // the new graph's id, or abort_graph when the capture failed.
  void begin_graph(int origin_stream, cudaStream_t origin);
  void end_graph(int graph);
  void abort_graph() noexcept;
  // Whether graph `graph` was captured with per-op times.
  bool graph_has_op_times(int graph) const { return graphs_.count(graph) != 0; }
  // Before each launch of a graph with op times: its ops join the timeline.
  void note_replay(int graph);
  // After the graph's exec is destroyed and its last replay has run.
  void drop_graph(int graph);
  void record_memory(double time_us, int64_t bytes);  // thread-safe (alloc/free may race)

  // The caller has synchronized every stream. Converts, clears, and re-anchors if on.
  Timeline take(std::vector<std::string> stream_names);

 private:
  // An event and the relay it is measured from (-1: the anchor). A graph's event is fixed
  // (its host time kept) before a later replay records it again.
  struct Mark {
    cudaEvent_t event = nullptr;
    int relay = -1;
    bool fixed = false;
    double fixed_us = 0;
  };
  struct PendingOp {
    const char* label = nullptr;
    const char* waited_for = nullptr;
    int stream = -1;
    OpKind kind = OpKind::Kernel;
    Mark start, end;                            // unused for host spans
    double host_start_us = 0, host_end_us = 0;  // host spans; for eager waits, the issue time
  };
  // A graph's ops, as captured (their marks' relays are set at each replay), and the events
  // it records; `pending`: a replay's ops refer to the events and are not fixed yet.
  struct GraphOps {
    std::vector<PendingOp> ops;
    std::vector<cudaEvent_t> events;
    bool pending = false;
  };
  cudaEvent_t take_event();
  void anchor();
  int current_relay();  // records a new relay when the last one is old
  void grow_stream_tables(int stream);
  double relay_host_us(int relay);  // the relay's host time (the anchor's for -1)
  double host_time_of(const Mark& mark);
  // Records a graph event after the work enqueued so far on `native` (under capture).
  Mark graph_mark(cudaStream_t native);
  void fix_pending(GraphOps& g);  // waits for its last replay and fixes the marks on its events
  void grow_capture_table(int stream);
  static void destroy_events(GraphOps& g) noexcept;

  bool enabled_ = false;
  cudaStream_t anchor_stream_ = nullptr;
  cudaEvent_t anchor_event_ = nullptr;
  double anchor_host_us_ = 0;
  std::vector<cudaEvent_t> relays_;  // on anchor_stream_, in recording order
  std::vector<double> relay_us_;     // the host times of relays_[0..size), measured lazily
  double last_relay_host_us_ = 0;

  std::vector<cudaEvent_t> free_events_;  // timing-enabled, reused after take()
  std::vector<cudaEvent_t> used_events_;
  std::vector<PendingOp> ops_;
  std::vector<Mark> last_end_by_stream_;
  std::vector<const char*> last_label_by_stream_;
  std::vector<const char*> label_by_event_;

  // Note [Timeline inside CUDA graphs]: the capture in progress (timed or not), its ops, and
  // the last op end of each stream inside it.
  bool in_capture_ = false;
  bool capture_timed_ = false;
  GraphOps capture_;
  Mark capture_start_;
  std::vector<Mark> capture_last_end_by_stream_;
  std::map<int, GraphOps> graphs_;

  std::mutex memory_mutex_;
  std::vector<MemSample> memory_;
};

}  // namespace fsdp::cuda
