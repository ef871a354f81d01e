// CudaDevice: capturing work into CUDA graphs and replaying it.
//
// Note [CUDA graph capture]
// begin_capture waits for every stream, releases the pool's cached free blocks (the graph's
// transient memory comes from CUDA's graph memory, so cached eager blocks would double the
// footprint) and starts a relaxed-mode stream capture on the origin stream. Side streams join
// the capture the CUDA way: by waiting on an event recorded inside it, and they must rejoin the
// origin stream before end_capture (CUDA reports "unjoined" work otherwise). While capturing:
// - A wait on an event last recorded before the capture is dropped: begin_capture already
//   waited for that work, and replay orders the graph after every stream's earlier work.
// - alloc/free become graph memory nodes (cudaMallocFromPoolAsync under capture makes one with
//   the pool's properties). Memory allocated inside must be freed inside, and memory from
//   before may not be freed inside: either would cross from one replay into the next.
// - copy_from_host and staged descriptor lists read a pinned snapshot the graph owns, so a
//   replay copies the bytes the host had at capture time (the staging ring's slots are reused).
// - Host waits (synchronize*, query_event) raise a UserError, and so does work issued on a
//   stream that never joined the capture (it would run at once, outside the graph, possibly on
//   graph memory that exists only inside it), before it is enqueued.
// Failures surface as one-line UserErrors from end_capture (or the host wait itself); the
// caller then calls abort_capture, which drops the half-made graph.
#include <algorithm>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/nccl_watchdog.h"

namespace fsdp::cuda {

namespace {
constexpr const char* kCannotCapture = "cannot capture the training step in a CUDA graph: ";
}

void CudaDevice::note_captured(int stream_id, cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FSDP_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  // Raised before the work is enqueued: run now, it could touch graph memory that does not
  // exist outside the graph.
  if (status != cudaStreamCaptureStatusActive)
    FSDP_USER_FAIL(kCannotCapture, "work on stream '", streams_[stream_id].name, "' ('", label_,
                   "') was issued before that stream waited on the captured step, so it would "
                   "run once, outside the graph");
  if (std::find(capture_.streams.begin(), capture_.streams.end(), stream_id) ==
      capture_.streams.end())
    capture_.streams.push_back(stream_id);
}

void CudaDevice::fail_if_capturing(const char* what) const {
  if (capture_.active) [[unlikely]]
    FSDP_USER_FAIL(kCannotCapture, "the host waits for the device inside the step (", what,
                   " after '", label_, "')");
}

void* CudaDevice::snapshot(const void* host_data, size_t bytes) {
  void* pinned = nullptr;
  FSDP_CUDA_CHECK(cudaMallocHost(&pinned, bytes ? bytes : 1));
  capture_.pinned.push_back(pinned);
  std::memcpy(pinned, host_data, bytes);
  return pinned;
}

void CudaDevice::orphan_live_allocations() {
  // Their graph is gone, so the memory never existed; their owners free them later (free()
  // then only drops them from the ledger).
  for (const auto& [ptr, tag] : capture_.live) orphaned_.insert(ptr);
  capture_.live.clear();
}

void CudaDevice::reset_capture() {
  const uint64_t epoch = capture_.epoch;  // events compare against it: it only grows
  capture_ = Capture{};
  capture_.epoch = epoch;
}

void CudaDevice::begin_capture(Stream s) {
  FSDP_CHECK(!capture_.active, "begin_capture while a capture is in progress");
  const cudaStream_t stream = native(s);
  synchronize();
  make_current();
  // The pool can only give back blocks whose stream-ordered frees it knows have completed.
  // Waiting for each stream did not make them so: measured at llama1b, the trim then released
  // nothing and the pool kept 4.2 GiB of eager-mode cache beside the graph's 3.5 GiB (reserved
  // 24.2 GiB against eager's 20.6). After a device-wide sync it releases them (19.97 GiB).
  FSDP_CUDA_CHECK(cudaDeviceSynchronize());
  FSDP_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
  // The high-water marks restart here, so backend_peak_bytes() measures the replayed steps
  // (persistent state in the pool plus the graph's memory), not the eager steps before them.
  uint64_t zero = 0;
  FSDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero));
  FSDP_CUDA_CHECK(cudaDeviceSetGraphMemAttribute(ordinal_, cudaGraphMemAttrUsedMemHigh, &zero));
  FSDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero));
  FSDP_CUDA_CHECK(cudaDeviceSetGraphMemAttribute(ordinal_, cudaGraphMemAttrReservedMemHigh, &zero));
  if (!graph_join_) FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&graph_join_, cudaEventDisableTiming));
  reset_capture();
  ++capture_.epoch;
  capture_.origin = s.id;
  FSDP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  capture_.active = true;
  capture_.streams.push_back(s.id);
  try {
    timeline_.begin_graph(s.id, stream);  // Note [Timeline inside CUDA graphs]
  } catch (...) {
    abort_capture(s);
    throw;
  }
}

int CudaDevice::end_capture(Stream s) {
  FSDP_CHECK(capture_.active && s.id == capture_.origin,
             "end_capture on stream ", s.id, " without a capture begun on it");
  make_current();
  cudaGraph_t graph = nullptr;
  const cudaError_t status = cudaStreamEndCapture(native(s), &graph);
  capture_.active = false;
  std::string error = capture_.error;
  if (error.empty() && status == cudaErrorStreamCaptureUnjoined)
    error = "work on a side stream never joins back to the step's stream (no event recorded "
            "after it is waited on)";
  else if (error.empty() && status != cudaSuccess)
    error = fsdp::detail::concat("CUDA stopped the capture (", cudaGetErrorString(status), ")");
  if (error.empty() && !capture_.live.empty()) {
    std::string tags;
    for (const auto& [ptr, tag] : capture_.live)
      if (tags.find(mem_tag_name(tag)) == std::string::npos)
        tags += std::string(tags.empty() ? "" : ", ") + mem_tag_name(tag);
    error = fsdp::detail::concat(capture_.live.size(), " allocations made inside the step outlive it (",
                           tags, "), so the graph could not run a second time");
  }
  cudaGraphExec_t exec = nullptr;
  if (error.empty()) {
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    if (made != cudaSuccess)
      error = fsdp::detail::concat("instantiating the graph failed (", cudaGetErrorString(made), ")");
  }
  if (graph) (void)cudaGraphDestroy(graph);
  if (!error.empty()) {
    (void)cudaGetLastError();
    for (void* p : capture_.pinned) (void)cudaFreeHost(p);
    orphan_live_allocations();
    reset_capture();
    timeline_.abort_graph();
    FSDP_USER_FAIL(kCannotCapture, error);
  }
  graphs_.push_back(Graph{exec, capture_.streams, std::move(capture_.pinned)});
  reset_capture();
  const int id = static_cast<int>(graphs_.size()) - 1;
  timeline_.end_graph(id);
  return id;
}

void CudaDevice::abort_capture(Stream) noexcept {
  if (!capture_.active) return;
  (void)cudaSetDevice(ordinal_);
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(streams_[capture_.origin].native, &graph);
  if (graph) (void)cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  for (void* p : capture_.pinned) (void)cudaFreeHost(p);
  orphan_live_allocations();
  reset_capture();
  timeline_.abort_graph();
}

void CudaDevice::replay(int graph, Stream s) {
  FSDP_CHECK(graph >= 0 && graph < static_cast<int>(graphs_.size()) && graphs_[graph].exec,
             "graph ", graph, " does not exist on ", name());
  FSDP_CHECK(!capture_.active, "replay inside a capture");
  const Graph& g = graphs_[graph];
  // A graph captured with the timeline on puts its own ops on it (Note [Timeline inside CUDA
  // graphs]); another is one op, the whole replay.
  const bool op_times = timeline_.enabled() && timeline_.graph_has_op_times(graph);
  if (op_times) timeline_.note_replay(graph);
  OpScope op(*this, s, OpKind::Kernel, /*timed=*/!op_times);
  // The graph forks its side streams from `s`; order it after their earlier work too, and
  // their later work after it (an evaluation between steps runs eagerly on them).
  for (int id : g.streams) {
    if (id == s.id) continue;
    FSDP_CUDA_CHECK(cudaEventRecord(graph_join_, streams_[id].native));
    FSDP_CUDA_CHECK(cudaStreamWaitEvent(op.stream(), graph_join_, 0));
  }
  FSDP_CUDA_CHECK(cudaGraphLaunch(g.exec, op.stream()));
  FSDP_CUDA_CHECK(cudaEventRecord(graph_join_, op.stream()));
  for (int id : g.streams)
    if (id != s.id) FSDP_CUDA_CHECK(cudaStreamWaitEvent(streams_[id].native, graph_join_, 0));
}

void CudaDevice::destroy_graph(int graph) {
  FSDP_CHECK(graph >= 0 && graph < static_cast<int>(graphs_.size()) && graphs_[graph].exec,
             "graph ", graph, " does not exist on ", name());
  make_current();
  Graph& g = graphs_[graph];
  // Its last replay may still run: the host copies it reads and its NCCL plans go only after.
  for (const StreamEntry& s : streams_) FSDP_CUDA_CHECK(cudaStreamSynchronize(s.native));
  FSDP_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
  for (void* p : g.pinned) FSDP_CUDA_CHECK(cudaFreeHost(p));
  g = Graph{};
  timeline_.drop_graph(graph);
}

bool CudaDevice::graph_has_op_times(int graph) const { return timeline_.graph_has_op_times(graph); }

std::vector<std::string> CudaDevice::graph_streams(int graph) const {
  FSDP_CHECK(graph >= 0 && graph < static_cast<int>(graphs_.size()), "graph ", graph,
             " does not exist on ", name());
  std::vector<std::string> names;
  for (int id : graphs_[graph].streams) names.push_back(streams_[id].name);
  return names;
}

int64_t CudaDevice::backend_peak_bytes() const {
  uint64_t graph_high = 0;
  FSDP_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(ordinal_, cudaGraphMemAttrUsedMemHigh, &graph_high));
  return pool_peak_bytes() + static_cast<int64_t>(graph_high);
}

double CudaDevice::host_wait_us() const { return host_waited_us(); }

int64_t CudaDevice::backend_reserved_peak_bytes() const {
  uint64_t pool_high = 0, graph_high = 0;
  FSDP_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &pool_high));
  FSDP_CUDA_CHECK(
      cudaDeviceGetGraphMemAttribute(ordinal_, cudaGraphMemAttrReservedMemHigh, &graph_high));
  return static_cast<int64_t>(pool_high + graph_high);
}

void CudaDevice::release_graphs() noexcept {
  for (Graph& g : graphs_) {
    if (g.exec) (void)cudaGraphExecDestroy(g.exec);
    for (void* p : g.pinned) (void)cudaFreeHost(p);
  }
  graphs_.clear();
  if (graph_join_) (void)cudaEventDestroy(graph_join_);
  graph_join_ = nullptr;
}

}  // namespace fsdp::cuda
