// CudaDevice: construction, streams, events, memory, host copies and the timeline.
// The compute and FSDP ops are in cuda_device_ops.cpp. See Note [CUDA device].
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/nccl_watchdog.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cudnn_attention.h"
#include "fsdp/out_of_memory.h"

namespace fsdp::cuda {

CudaDevice::OpScope::OpScope(CudaDevice& device, Stream s, OpKind kind, bool timed)
    : device_(device) {
  device.make_current();
  stream_ = device.native(s);
  if (device.capture_.active) [[unlikely]]
    device.note_captured(s.id, stream_);
  // Under a capture the op's events go into the graph (Note [Timeline inside CUDA graphs]).
  if (timed && device.timeline_.enabled()) [[unlikely]]
    token_ = device.timeline_.begin(s.id, stream_, device.label_, kind);
}

CudaDevice::OpScope::~OpScope() {
  if (token_ != -1) device_.timeline_.end(token_, stream_);  // <= -2: an op inside a capture
}

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  if (const char* choice = std::getenv("FSDP_ATTENTION"); choice && *choice) {
    const std::string value = choice;
    FSDP_CHECK(value == "cudnn" || value == "simt",
               "FSDP_ATTENTION must be cudnn or simt, got '", value, "'");
    attention_simt_ = value == "simt";
  }
  FSDP_CUDA_CHECK(cudaSetDevice(ordinal_));
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = ordinal_;
  FSDP_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
  try {
    uint64_t keep_everything = UINT64_MAX;
    FSDP_CUDA_CHECK(
        cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything));
    gemm_ = std::make_unique<LtGemm>(pool_);
    staging_ = std::make_unique<StagingRing>(pool_);
  } catch (...) {
    gemm_.reset();
    (void)cudaMemPoolDestroy(pool_);
    throw;
  }
}

CudaDevice::~CudaDevice() {
  // Nothing here may throw. Let queued work finish so that the buffers it uses (workspaces,
  // staging) are not freed under it, then release in dependency order; the pool goes last
  // (a pool with live allocations is released by CUDA once they are freed).
  (void)cudaSetDevice(ordinal_);
  abort_capture(Stream{capture_.origin});
  // After a watchdog abort (Note [NCCL watchdog]) a stream may never drain: skip the wait.
  if (!watchdog_aborted())
    for (const StreamEntry& s : streams_) (void)cudaStreamSynchronize(s.native);
  release_graphs();
  gemm_.reset();
  cudnn_attention_.reset();
  staging_.reset();
  for (cudaEvent_t e : events_)
    if (e) (void)cudaEventDestroy(e);
  for (const StreamEntry& s : streams_) (void)cudaStreamDestroy(s.native);
  (void)cudaMemPoolDestroy(pool_);
}

void CudaDevice::make_current() const {
  int current = -1;
  FSDP_CUDA_CHECK(cudaGetDevice(&current));
  if (current != ordinal_) FSDP_CUDA_CHECK(cudaSetDevice(ordinal_));
}

cudaStream_t CudaDevice::native(Stream s) const {
  FSDP_CHECK(s.id >= 0 && s.id < static_cast<int>(streams_.size()), "stream ", s.id,
             " does not exist on ", name());
  return streams_[s.id].native;
}

cudaEvent_t CudaDevice::native_event(Event e) const {
  FSDP_CHECK(e.id >= 0 && e.id < static_cast<int>(events_.size()) && events_[e.id] != nullptr,
             "event ", e.id, " does not exist on ", name());
  return events_[e.id];
}

// ---- streams and events

Stream CudaDevice::create_stream(const std::string& name, StreamPriority priority) {
  make_current();
  int least = 0, greatest = 0;  // numerically, greatest <= least
  FSDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  const int cuda_priority = priority == StreamPriority::High ? greatest : least;
  cudaStream_t stream = nullptr;
  FSDP_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, cuda_priority));
  streams_.push_back(StreamEntry{stream, name});
  return Stream{static_cast<int>(streams_.size()) - 1};
}

Event CudaDevice::create_event() {
  make_current();
  cudaEvent_t event = nullptr;
  FSDP_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  if (!free_event_ids_.empty()) {
    const int id = free_event_ids_.back();
    free_event_ids_.pop_back();
    events_[id] = event;
    event_recorded_[id] = 0;
    event_epoch_[id] = 0;
    return Event{id};
  }
  events_.push_back(event);
  event_recorded_.push_back(0);
  event_epoch_.push_back(0);
  return Event{static_cast<int>(events_.size()) - 1};
}

void CudaDevice::destroy_event(Event e) {
  make_current();
  // Safe with work pending on the event: CUDA releases it once that work completes.
  FSDP_CUDA_CHECK(cudaEventDestroy(native_event(e)));
  events_[e.id] = nullptr;
  free_event_ids_.push_back(e.id);
}

void CudaDevice::record_event(Event e, Stream s) {
  make_current();
  const cudaStream_t stream = native(s);
  if (capture_.active) [[unlikely]]
    note_captured(s.id, stream);
  FSDP_CUDA_CHECK(cudaEventRecord(native_event(e), stream));
  event_recorded_[e.id] = 1;
  event_epoch_[e.id] = capture_.active ? capture_.epoch : 0;
  if (timeline_.enabled()) [[unlikely]]
    timeline_.note_event_recorded(e.id, s.id);
}

void CudaDevice::wait_event(Stream s, Event e) {
  make_current();
  const cudaStream_t stream = native(s);
  // Note [CUDA graph capture]: an event last recorded before the capture marks work that
  // begin_capture already waited for, and a replay starts after every stream's earlier work;
  // CUDA forbids waiting on it inside a capture, and the wait has nothing to order.
  if (capture_.active && event_epoch_[e.id] != capture_.epoch) [[unlikely]]
    return;
  FSDP_CUDA_CHECK(cudaStreamWaitEvent(stream, native_event(e), 0));
  if (capture_.active) [[unlikely]]
    note_captured(s.id, stream);  // the wait is what brings a side stream into the capture
  if (timeline_.enabled() && event_recorded_[e.id]) [[unlikely]]
    timeline_.record_wait(s.id, stream, e.id, label_);
}

bool CudaDevice::query_event(Event e) {
  fail_if_capturing("query_event");
  make_current();
  const cudaError_t status = cudaEventQuery(native_event(e));
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error for the next check
    return false;
  }
  FSDP_CUDA_CHECK(status);
  return false;
}

void CudaDevice::synchronize_event(Event e) {
  fail_if_capturing("synchronize_event");
  make_current();
  const cudaEvent_t native = native_event(e);
  FSDP_CUDA_CHECK(poll_until_ready([&] { return cudaEventQuery(native); }));
}

void CudaDevice::synchronize_stream(Stream s) {
  fail_if_capturing("synchronize_stream");
  make_current();
  const cudaStream_t stream = native(s);
  FSDP_CUDA_CHECK(poll_until_ready([&] { return cudaStreamQuery(stream); }));
  rethrow_host_task_error();
}

void CudaDevice::synchronize() {
  fail_if_capturing("synchronize");
  make_current();
  // An asynchronous fault (illegal address, trap) surfaces in these calls as an error code.
  // Polled, not blocking, so that a watchdog abort ends the wait (Note [NCCL watchdog]).
  for (const StreamEntry& s : streams_)
    FSDP_CUDA_CHECK(poll_until_ready([&] { return cudaStreamQuery(s.native); }));
  FSDP_CUDA_CHECK(cudaGetLastError());
  rethrow_host_task_error();
}

// ---- memory

void* CudaDevice::alloc(size_t bytes, Stream s, MemTag tag) {
  FSDP_CHECK(static_cast<int>(tag) < kMemTagCount, "bad memory tag ", static_cast<int>(tag));
  make_current();
  const cudaStream_t stream = native(s);
  if (capture_.active) [[unlikely]]
    note_captured(s.id, stream);  // else a pool block, freed inside the graph at every replay
  void* ptr = nullptr;
  // A zero-byte request still gets a distinct pointer, so alloc/free pair up as usual.
  const cudaError_t status = cudaMallocFromPoolAsync(&ptr, bytes ? bytes : 1, pool_, stream);
  if (status == cudaErrorMemoryAllocation) {  // Note [Out of memory]
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) total_bytes = 0;
    (void)cudaGetLastError();
    throw OutOfMemoryError(name(), bytes, tag, memory_stats().current_bytes,
                           static_cast<int64_t>(total_bytes));
  }
  FSDP_CUDA_CHECK(status);
  // Under capture the pool only lends its properties: the memory is the graph's (a graph
  // memory node), and it must be freed inside the same capture.
  if (capture_.active) [[unlikely]]
    capture_.live.emplace(ptr, tag);
  const int64_t current = ledger_.add(ptr, bytes, tag);
  if (timeline_.enabled() && !capture_.active) [[unlikely]]
    timeline_.record_memory(now_us(), current);
  return ptr;
}

void CudaDevice::free(void* ptr, Stream s) {
  if (!ptr) return;
  make_current();
  const cudaStream_t stream = native(s);
  const core::AllocationLedger::Entry entry = ledger_.remove(ptr, name());
  const int64_t current = ledger_.current_bytes();
  if (!orphaned_.empty() && orphaned_.erase(ptr) != 0) [[unlikely]]
    return;  // from a capture that failed: never real memory
  if (capture_.active && capture_.live.erase(ptr) == 0) [[unlikely]] {
    // Memory from before the capture cannot be freed by a graph that runs many times; free
    // may run in a destructor, so the capture fails at end_capture instead of here (and the
    // block stays allocated).
    if (capture_.error.empty())
      capture_.error = fsdp::detail::concat("the step frees ", mem_tag_name(entry.tag),
                                      " memory allocated before it (state that crosses steps)");
    return;
  }
  FSDP_CUDA_CHECK(cudaFreeAsync(ptr, stream));
  if (timeline_.enabled() && !capture_.active) [[unlikely]]
    timeline_.record_memory(now_us(), current);
}

MemStats CudaDevice::memory_stats() const { return ledger_.stats(); }

void* CudaDevice::alloc_host(size_t bytes) {
  make_current();
  void* p = nullptr;
  FSDP_CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
  return p;
}

void CudaDevice::free_host(void* ptr) {
  if (!ptr) return;
  make_current();
  FSDP_CUDA_CHECK(cudaFreeHost(ptr));
}

void CudaDevice::reset_peak_memory() {
  ledger_.reset_peak();
  make_current();
  uint64_t zero = 0;  // the only value CUDA accepts: resets the high-water mark to current
  FSDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero));
  FSDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero));
  FSDP_CUDA_CHECK(cudaDeviceSetGraphMemAttribute(ordinal_, cudaGraphMemAttrUsedMemHigh, &zero));
  FSDP_CUDA_CHECK(cudaDeviceSetGraphMemAttribute(ordinal_, cudaGraphMemAttrReservedMemHigh, &zero));
}

int64_t CudaDevice::pool_used_bytes() const {
  uint64_t value = 0;
  FSDP_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &value));
  return static_cast<int64_t>(value);
}

int64_t CudaDevice::pool_peak_bytes() const {
  uint64_t value = 0;
  FSDP_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &value));
  return static_cast<int64_t>(value);
}

// ---- copies between host and device

void CudaDevice::copy(Stream s, void* dst, const void* src, size_t bytes) {
  OpScope op(*this, s, OpKind::Copy);
  if (bytes == 0) return;
  FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, op.stream()));
}

void CudaDevice::copy_from_host(Stream s, void* dst, const void* host_src, size_t bytes) {
  OpScope op(*this, s, OpKind::Copy);
  if (bytes == 0) return;
  if (capture_.active) [[unlikely]] {
    // Note [CUDA graph capture]: the graph copies these bytes, as they are now, at every replay.
    FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, snapshot(host_src, bytes), bytes,
                                    cudaMemcpyHostToDevice, op.stream()));
    return;
  }
  if (bytes <= StagingRing::kMaxStagedCopyBytes) {
    // Small, frequent uploads (labels, scalars): copied into pinned staging now, so the
    // caller's buffer is free on return and the stream is not synchronized.
    staging_->copy_to_device(op.stream(), dst, host_src, bytes);
    return;
  }
  // Large uploads (weights at start-up). cudaMemcpyAsync from pageable memory does return
  // only after the source is consumed, but from page-locked memory it returns at once, and
  // we cannot know which kind the caller has; a sync makes "reusable on return" hold always.
  // cudaMemcpyDefault: the destination may be page-locked host memory (the offloaded
  // optimizer's state, which a checkpoint loads; Note [Host-side stream work]).
  FSDP_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, op.stream()));
  const cudaStream_t stream = op.stream();
  FSDP_CUDA_CHECK(poll_until_ready([&] { return cudaStreamQuery(stream); }));
}

void CudaDevice::copy_to_host(Stream s, void* host_dst, const void* src, size_t bytes) {
  OpScope op(*this, s, OpKind::Copy);
  if (bytes == 0) return;
  // cudaMemcpyDefault: the source may be page-locked host memory (the offloaded optimizer's
  // state, which a checkpoint saves; Note [Host-side stream work]).
  FSDP_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, op.stream()));
}

// ---- timeline

void CudaDevice::enable_timeline(bool on) {
  make_current();
  timeline_.enable(on);
}

Timeline CudaDevice::take_timeline() {
  synchronize();
  std::vector<std::string> names;
  names.reserve(streams_.size());
  for (const StreamEntry& s : streams_) names.push_back(s.name);
  return timeline_.take(std::move(names));
}

void CudaDevice::record_host_span(const char* label, double start_us, double end_us) {
  if (timeline_.enabled()) [[unlikely]]
    timeline_.record_host_span(label, start_us, end_us);
}

// ---- the backend's entry points (cuda_backend.h)

CudaDevice& as_cuda_device(Device& device) {
  auto* cuda_device = dynamic_cast<CudaDevice*>(&device);
  FSDP_CHECK(cuda_device != nullptr, "device ", device.name(), " is not a CUDA device");
  return *cuda_device;
}

cudaStream_t native_stream(Device& device, Stream s) {
  return as_cuda_device(device).native(s);
}

bool compiled_with_cuda() {
  return true;
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no GPU: an answer, not an error
    return 0;
  }
  return count;
}

GpuMemory device_memory(int gpu) {
  size_t free_bytes = 0, total_bytes = 0;
  if (gpu < 0 || gpu >= device_count() || cudaSetDevice(gpu) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return {static_cast<int64_t>(free_bytes), static_cast<int64_t>(total_bytes)};
}

std::unique_ptr<Device> make_device(int local_rank) {
  const int available = device_count();
  FSDP_CHECK(local_rank >= 0 && local_rank < available, "local rank ", local_rank, " needs GPU ",
             local_rank, " but ", available, " CUDA device(s) are visible");
  return std::make_unique<CudaDevice>(local_rank);
}

}  // namespace fsdp::cuda
