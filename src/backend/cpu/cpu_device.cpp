// Note [CPU backend]
// The CPU backend runs a whole launch in one process so that the engine's stream, event and
// memory discipline can be tested without a GPU, and tested harder than a GPU would: each
// rank is a thread of the launcher, and each stream of a rank is a worker thread running a
// FIFO queue of std::function tasks (cpu_stream.h). Enqueuing returns at once; work really
// runs later and streams really run concurrently, so a missing wait_event is a real race.
//
//  - Events have CUDA semantics by generation. record_event bumps the event's recorded
//    generation at call time and enqueues a task that marks that generation reached;
//    wait_event captures the generation at call time and enqueues a task that blocks until it
//    is reached (a never-recorded event makes the wait a no-op). Each slot keeps the set of
//    generations not reached yet, so records on two streams that finish out of order are
//    still exact, and ids are reused with generations that never go back.
//  - Memory (cpu_allocator.h): counters change when alloc/free are called, so the engine's
//    memory tests are exact and timing-independent. The release itself is a task on the
//    free's stream (stream-ordered). In checked mode the task fills the memory with 0xFF
//    (NaN in fp32 and bf16) and keeps it quarantined, so a stream that reads memory freed
//    too early computes NaN; fresh allocations start as NaN too, so reads of never-written
//    memory are caught the same way. Writes into freed memory are caught by checking that
//    the poison is intact when a block leaves quarantine and, for every block still in it,
//    at each device-wide synchronize; the error names the allocation's tag and size.
//  - Errors: an exception in a task (a collective mismatch, a bad label index, an abort)
//    becomes the device's sticky error. Streams keep draining but skip work, except the
//    bookkeeping tasks (event completion, memory release) that others may depend on, and
//    every synchronize rethrows the error.
//  - Abort and shutdown: every blocking wait polls the world's abort flag and its device's
//    shutdown flag (kCancelPollInterval), so CpuWorld::abort wakes ranks blocked in a
//    collective or an event wait, and destroying a device never hangs on a wait that can no
//    longer be satisfied; worker threads are always joined.
//  - Chaos mode: a random sleep before every task and between the phases of a collective,
//    from a generator per stream seeded by (seed, rank, stream id). It shakes out schedules
//    that are only correct under lucky timing while keeping each run's delays reproducible.
//  - Virtual clock (CpuOptions::virtual_clock): spins, the simulated link and chaos delays
//    advance simulated time instead of sleeping, and the streams of all ranks stay in step
//    through it, so timings are exact on any machine; see Note [Virtual clock] in
//    cpu_virtual_clock.cpp.
//  - Collectives time out (CpuOptions::collective_timeout_s, wall time) rather than hang.
//  - Timeline: tasks capture the device's sticky label when enqueued; when recording is on,
//    each task's run time is recorded on its stream's track, measured on a clock whose origin
//    is the world's (or on the virtual clock), so the tracks of all ranks line up.
//  - Stream priority is accepted and ignored: the OS schedules the worker threads.
//  - Collectives are stream tasks too; see Note [CPU collectives] in cpu_comm.cpp.
#include "backend/cpu/cpu_device.h"

#include <cstdlib>
#include <new>
#include <utility>

#include "backend/cpu/cpu_kernels.h"
#include "fsdp/error.h"

namespace fsdp::cpu {

CpuDevice::CpuDevice(std::shared_ptr<WorldState> world, int rank)
    : StreamDevice(world, rank, "cpu"),
      allocator_(world->options.checked, world->options.quarantine_bytes,
                 world->options.memory_capacity_bytes, "cpu:" + std::to_string(rank)) {
  kernels::configure_blas_once();
}

// The streams' last tasks release memory into the allocator: they go first.
CpuDevice::~CpuDevice() { stop_streams(); }

std::string CpuDevice::check_after_synchronize() {
  // Blocks still in quarantine are checked here too, so that a write after free is caught
  // in a run too short to cycle the quarantine.
  return allocator_.check_quarantine();
}

// ---- memory

void* CpuDevice::alloc(size_t bytes, Stream s, MemTag tag) {
  worker(s);  // validates the stream; the memory itself is usable at once
  void* ptr = allocator_.allocate(bytes, tag);
  sample_memory(allocator_.current_bytes());
  return ptr;
}

void CpuDevice::free(void* ptr, Stream s) {
  if (ptr == nullptr) return;
  worker(s);  // validates the stream
  const core::AllocationLedger::Entry entry = allocator_.forget(ptr);
  sample_memory(allocator_.current_bytes());
  enqueue_bookkeeping(s, [this, ptr, entry] { allocator_.release(ptr, entry); });
}

MemStats CpuDevice::memory_stats() const {
  return allocator_.stats();
}
void CpuDevice::reset_peak_memory() {
  allocator_.reset_peak();
}

void* CpuDevice::alloc_host(size_t bytes) {
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

void CpuDevice::free_host(void* ptr) {
  std::free(ptr);
}


}  // namespace fsdp::cpu
