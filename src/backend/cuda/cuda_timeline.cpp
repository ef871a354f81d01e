#include "backend/cuda/cuda_timeline.h"

#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "backend/cuda/cuda_check.h"

namespace fsdp::cuda {

namespace {
constexpr double kRelayIntervalUs = 200'000;  // Note [CUDA timeline clock]
}

TimelineRecorder::~TimelineRecorder() {
  destroy_events(capture_);
  for (auto& [id, g] : graphs_) destroy_events(g);
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : used_events_) (void)cudaEventDestroy(e);
  if (anchor_event_) (void)cudaEventDestroy(anchor_event_);
  if (anchor_stream_) (void)cudaStreamDestroy(anchor_stream_);
}

double TimelineRecorder::host_now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

void TimelineRecorder::anchor() {
  if (!anchor_stream_)
    FSDP_CUDA_CHECK(cudaStreamCreateWithFlags(&anchor_stream_, cudaStreamNonBlocking));
  if (!anchor_event_) FSDP_CUDA_CHECK(cudaEventCreate(&anchor_event_));
  const double before = host_now_us();
  FSDP_CUDA_CHECK(cudaEventRecord(anchor_event_, anchor_stream_));
  FSDP_CUDA_CHECK(cudaEventSynchronize(anchor_event_));
  anchor_host_us_ = 0.5 * (before + host_now_us());
  last_relay_host_us_ = anchor_host_us_;
}

void TimelineRecorder::enable(bool on) {
  // Ops still waiting for take() were measured against the current anchor: keep it for them.
  if (on && !enabled_ && (ops_.empty() || !anchor_event_)) anchor();
  enabled_ = on;
}

cudaEvent_t TimelineRecorder::take_event() {
  cudaEvent_t e = nullptr;
  if (!free_events_.empty()) {
    e = free_events_.back();
    free_events_.pop_back();
  } else {
    FSDP_CUDA_CHECK(cudaEventCreate(&e));  // timing enabled, unlike the engine's events
  }
  used_events_.push_back(e);
  return e;
}

int TimelineRecorder::current_relay() {
  const double now = host_now_us();
  if (now - last_relay_host_us_ >= kRelayIntervalUs) {
    cudaEvent_t relay = take_event();
    FSDP_CUDA_CHECK(cudaEventRecord(relay, anchor_stream_));
    relays_.push_back(relay);
    last_relay_host_us_ = now;
  }
  return static_cast<int>(relays_.size()) - 1;
}

void TimelineRecorder::grow_stream_tables(int stream) {
  if (stream < static_cast<int>(last_end_by_stream_.size())) return;
  last_end_by_stream_.resize(stream + 1);
  last_label_by_stream_.resize(stream + 1, nullptr);
}

int TimelineRecorder::begin(int stream, cudaStream_t native, const char* label, OpKind kind) {
  if (in_capture_ && !capture_timed_) return -1;
  grow_stream_tables(stream);
  PendingOp op;
  op.label = label;
  op.stream = stream;
  op.kind = kind;
  last_label_by_stream_[stream] = label;
  if (in_capture_) {  // Note [Timeline inside CUDA graphs]
    op.start = graph_mark(native);
    capture_.ops.push_back(op);
    return -2 - static_cast<int>(capture_.ops.size() - 1);
  }
  op.start.relay = current_relay();
  op.start.event = take_event();
  FSDP_CUDA_CHECK(cudaEventRecord(op.start.event, native));
  ops_.push_back(op);
  return static_cast<int>(ops_.size()) - 1;
}

void TimelineRecorder::end(int token, cudaStream_t native) noexcept {
  if (token <= -2) {  // an op inside the capture
    const size_t index = static_cast<size_t>(-2 - token);
    if (!in_capture_ || index >= capture_.ops.size()) return;
    PendingOp& op = capture_.ops[index];
    try {
      op.end = graph_mark(native);
      grow_capture_table(op.stream);
    } catch (...) {
      return;  // op.end stays empty: the op is dropped
    }
    capture_last_end_by_stream_[op.stream] = op.end;
    return;
  }
  if (token < 0 || token >= static_cast<int>(ops_.size())) return;
  PendingOp& op = ops_[token];
  cudaEvent_t e = nullptr;
  try {
    e = take_event();
  } catch (...) {
    return;  // op.end stays empty: take() drops the op
  }
  if (cudaEventRecord(e, native) != cudaSuccess) return;
  op.end = Mark{e, op.start.relay};  // recorded after the relay the start was measured from
  last_end_by_stream_[op.stream] = op.end;
}

void TimelineRecorder::note_event_recorded(int event_id, int stream) {
  if (event_id >= static_cast<int>(label_by_event_.size()))
    label_by_event_.resize(event_id + 1, nullptr);
  grow_stream_tables(stream);
  label_by_event_[event_id] = last_label_by_stream_[stream];
}

void TimelineRecorder::record_wait(int stream, cudaStream_t native, int event_id,
                                   const char* label) {
  if (in_capture_ && !capture_timed_) return;
  grow_stream_tables(stream);
  PendingOp op;
  op.label = label;
  op.stream = stream;
  op.kind = OpKind::Wait;
  op.waited_for =
      event_id < static_cast<int>(label_by_event_.size()) ? label_by_event_[event_id] : nullptr;
  if (in_capture_) {  // Note [Timeline inside CUDA graphs]: no issue time in a replay
    grow_capture_table(stream);
    op.end = graph_mark(native);
    const Mark& previous = capture_last_end_by_stream_[stream];
    op.start = previous.event ? previous : capture_start_;
    capture_last_end_by_stream_[stream] = op.end;
    capture_.ops.push_back(op);
    return;
  }
  op.host_start_us = host_now_us();
  op.end.relay = current_relay();
  op.end.event = take_event();
  FSDP_CUDA_CHECK(cudaEventRecord(op.end.event, native));
  // No earlier op on this stream since recording began: a zero-length wait at the event.
  op.start = last_end_by_stream_[stream].event ? last_end_by_stream_[stream] : op.end;
  last_end_by_stream_[stream] = op.end;
  ops_.push_back(op);
}

void TimelineRecorder::record_host_span(const char* label, double start_us, double end_us) {
  PendingOp op;
  op.label = label;
  op.stream = -1;
  op.kind = OpKind::Host;
  op.host_start_us = start_us;
  op.host_end_us = end_us;
  ops_.push_back(op);
}

void TimelineRecorder::record_memory(double time_us, int64_t bytes) {
  std::lock_guard<std::mutex> lock(memory_mutex_);
  memory_.push_back(MemSample{time_us, bytes});
}

// Each relay's host time is the one before's plus a short interval (Note [CUDA timeline clock]).
double TimelineRecorder::relay_host_us(int relay) {
  if (relay < 0) return anchor_host_us_;
  while (static_cast<int>(relay_us_.size()) <= relay) {
    const size_t k = relay_us_.size();
    float ms = 0;
    FSDP_CUDA_CHECK(cudaEventElapsedTime(&ms, k ? relays_[k - 1] : anchor_event_, relays_[k]));
    relay_us_.push_back((k ? relay_us_[k - 1] : anchor_host_us_) + 1000.0 * ms);
  }
  return relay_us_[relay];
}

double TimelineRecorder::host_time_of(const Mark& mark) {
  if (mark.fixed) return mark.fixed_us;
  float ms = 0;
  const cudaEvent_t from = mark.relay < 0 ? anchor_event_ : relays_[mark.relay];
  FSDP_CUDA_CHECK(cudaEventElapsedTime(&ms, from, mark.event));
  return relay_host_us(mark.relay) + 1000.0 * ms;
}

Timeline TimelineRecorder::take(std::vector<std::string> stream_names) {
  Timeline out;
  out.stream_names = std::move(stream_names);
  out.ops.reserve(ops_.size());
  for (const PendingOp& op : ops_) {
    TimelineOp t;
    t.label = op.label ? op.label : "";
    t.stream = op.stream;
    t.kind = op.kind;
    if (op.waited_for) t.waited_for = op.waited_for;
    if (op.kind == OpKind::Host) {
      t.start_us = op.host_start_us;
      t.end_us = op.host_end_us;
    } else {
      if (!op.start.event || !op.end.event) continue;
      t.start_us = host_time_of(op.start);
      // An eager wait cannot start before it was issued (a graph's waits have no issue time).
      if (op.kind == OpKind::Wait) t.start_us = std::max(t.start_us, op.host_start_us);
      // Event timestamps jitter by ~0.5 us (a wait already satisfied can "end" before the
      // previous op's end event): clamp so that no span is negative.
      t.end_us = std::max(t.start_us, host_time_of(op.end));
    }
    out.ops.push_back(std::move(t));
  }
  {
    std::lock_guard<std::mutex> lock(memory_mutex_);
    out.memory.swap(memory_);
  }
  ops_.clear();
  relays_.clear();
  relay_us_.clear();
  for (auto& [id, g] : graphs_) g.pending = false;  // their marks were in ops_
  free_events_.insert(free_events_.end(), used_events_.begin(), used_events_.end());
  used_events_.clear();
  // The recycled events may be re-recorded: forget every reference to them.
  std::fill(last_end_by_stream_.begin(), last_end_by_stream_.end(), Mark{});
  if (enabled_) anchor();
  return out;
}

}  // namespace fsdp::cuda

// ---- Note [Timeline inside CUDA graphs]

namespace fsdp::cuda {

TimelineRecorder::Mark TimelineRecorder::graph_mark(cudaStream_t native) {
  cudaEvent_t e = nullptr;
  FSDP_CUDA_CHECK(cudaEventCreate(&e));  // timing enabled
  capture_.events.push_back(e);
  FSDP_CUDA_CHECK(cudaEventRecordWithFlags(e, native, cudaEventRecordExternal));
  return Mark{e, -1};
}

void TimelineRecorder::grow_capture_table(int stream) {
  if (stream >= static_cast<int>(capture_last_end_by_stream_.size()))
    capture_last_end_by_stream_.resize(stream + 1);
}

void TimelineRecorder::destroy_events(GraphOps& g) noexcept {
  for (cudaEvent_t e : g.events) (void)cudaEventDestroy(e);
  g = GraphOps{};
}

void TimelineRecorder::begin_graph(int origin_stream, cudaStream_t origin) {
  destroy_events(capture_);
  capture_last_end_by_stream_.clear();
  capture_start_ = Mark{};
  in_capture_ = true;
  capture_timed_ = enabled_;
  if (!capture_timed_) return;
  capture_start_ = graph_mark(origin);
  grow_capture_table(origin_stream);
  capture_last_end_by_stream_[origin_stream] = capture_start_;
}

void TimelineRecorder::end_graph(int graph) {
  if (in_capture_ && capture_timed_) {
    GraphOps& g = graphs_[graph];
    destroy_events(g);  // an id reused after destroy_graph
    g = std::move(capture_);
  }
  capture_ = GraphOps{};
  in_capture_ = false;
}

void TimelineRecorder::abort_graph() noexcept {
  destroy_events(capture_);
  in_capture_ = false;
}

void TimelineRecorder::fix_pending(GraphOps& g) {
  if (!g.pending) return;
  // The last replay has to have run: its events keep its times only until the next launch.
  for (cudaEvent_t e : g.events) FSDP_CUDA_CHECK(cudaEventSynchronize(e));
  if (!relays_.empty()) FSDP_CUDA_CHECK(cudaEventSynchronize(relays_.back()));
  const std::unordered_set<cudaEvent_t> mine(g.events.begin(), g.events.end());
  auto fix = [&](Mark& m) {
    if (m.event && !m.fixed && mine.count(m.event)) {
      m.fixed_us = host_time_of(m);
      m.fixed = true;
    }
  };
  for (PendingOp& op : ops_) {
    fix(op.start);
    fix(op.end);
  }
  for (Mark& m : last_end_by_stream_) fix(m);
  g.pending = false;
}

void TimelineRecorder::note_replay(int graph) {
  auto it = graphs_.find(graph);
  if (it == graphs_.end()) return;
  GraphOps& g = it->second;
  fix_pending(g);
  const int relay = current_relay();  // recorded before the launch
  for (PendingOp op : g.ops) {
    op.start.relay = relay;
    op.end.relay = relay;
    ops_.push_back(op);
    if (!op.end.event) continue;
    grow_stream_tables(op.stream);
    last_end_by_stream_[op.stream] = op.end;  // an eager wait after the replay starts here
  }
  g.pending = true;
}

void TimelineRecorder::drop_graph(int graph) {
  auto it = graphs_.find(graph);
  if (it == graphs_.end()) return;
  fix_pending(it->second);
  destroy_events(it->second);
  graphs_.erase(it);
}

}  // namespace fsdp::cuda
