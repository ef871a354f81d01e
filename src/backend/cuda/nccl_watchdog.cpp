// Note [NCCL watchdog]
// A rank whose peer died waits forever: NCCL's kernels spin for data that never comes, and
// the host blocks in its next synchronization. The watchdog ends that wait.
//  - Every collective on a watched communicator records a CUDA event after it on its stream
//    (not while the stream is being captured into a CUDA graph: such an event is not
//    queryable). A thread polls, about ten times a second, the oldest pending event of each
//    communicator and ncclCommGetAsyncError.
//  - A collective that has not completed `timeout` seconds after it could start (its issue,
//    or the completion of the one before it on the communicator, whichever is later, so work
//    queued long before its turn does not count), or an asynchronous NCCL error, makes the
//    watchdog abort every watched communicator of the process (ncclCommAbort, which also
//    ends the NCCL kernels still spinning, so the streams drain) and record why. A rank that
//    pauses between collectives for longer (a long checkpoint write) needs a larger --timeout.
//  - Host waits in CudaDevice poll (poll_until_ready) instead of blocking in
//    cudaStreamSynchronize, so they see the abort and throw its error; NCCL calls check it
//    before they enqueue. The rank's error then unwinds like any other, and a launcher child
//    exits non-zero.
//  - Backstop: in a process that is one rank (set_exit_when_hung, set by the launchers), a
//    host that has not come back 10 s after the abort (stuck inside an NCCL call that the
//    abort did not end) gets the error printed and the process exits with status 1.
//  - Which peer died NCCL cannot say. The --nproc parent names it (it sees the child's exit,
//    src/launch/rank_processes.h) and stops the others at once, usually long before this
//    timeout. Each rank sets set_lost_rank_reader to read the failure notice in the job's
//    store (Note [Failure notices]): a rank that threw posts its error there, and under
//    torchrun (without its agent store), srun or mpirun our store's server posts the death of
//    a rank whose connection closed without a goodbye, so the watchdog's error names it.
//    Each rank of a multi-rank job also reads the store once a second (FailureWatch,
//    src/rendezvous/failure_watch.h): another rank's notice aborts at once
//    (abort_communicators), instead of after the timeout. The abort happens once per process,
//    whoever comes first; after it the polling thread stops (an aborted communicator is freed).
//  - Order at teardown: a CUDA graph that captured collectives must be destroyed before its
//    communicator (the trainer destroys its captured step first, Note [Captured steps]); the
//    watchdog records no events while a stream is captured. An aborted communicator is never
//    finalized (ncclCommDestroy would wait for the dead peer).
#include "backend/cuda/nccl_watchdog.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"

namespace fsdp::cuda {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<double> g_timeout_s{60.0};
std::atomic<bool> g_exit_when_hung{false};
std::atomic<bool> g_aborted{false};
constexpr double kExitGraceSeconds = 10;
constexpr double kLostRankWaitSeconds = 5;  // for a launcher a moment behind the broken rank

std::mutex g_reader_mutex;
std::function<std::string(double)> g_lost_rank_reader;

std::string lost_rank() {
  std::function<std::string(double)> reader;
  {
    std::lock_guard<std::mutex> lock(g_reader_mutex);
    reader = g_lost_rank_reader;
  }
  if (!reader) return "";
  try {
    return reader(kLostRankWaitSeconds);
  } catch (const std::exception&) {
    return "";  // the store may have gone with the lost rank: the error says what it can
  }
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

// The process's watchdog: the registry of watched communicators and the polling thread,
// started with the first communicator (so never before a launcher forks).
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* instance = new Watchdog();  // never destroyed: rank threads may outlive main
    return *instance;
  }

  void add(WatchedComm* comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.push_back(comm);
    if (!thread_started_) {
      thread_started_ = true;
      std::thread([this] { run(); }).detach();
    }
  }
  void remove(WatchedComm* comm) {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), comm), comms_.end());
  }
  std::string reason() {
    std::lock_guard<std::mutex> lock(reason_mutex_);
    return reason_;
  }
  void abort_now(int rank, const std::string& why) { abort_all(rank, why); }

 private:
  void run() {
    for (;;) {
      const double timeout = g_timeout_s.load();
      const double interval = timeout > 0 ? std::clamp(timeout / 10, 0.01, 0.1) : 0.1;
      std::this_thread::sleep_for(std::chrono::duration<double>(interval));
      if (g_aborted.load(std::memory_order_acquire)) return;  // aborted from outside
      std::string why;
      int rank = -1;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (WatchedComm* c : comms_) {
          why = check(*c, timeout);
          if (!why.empty()) {
            rank = c->global_rank_;
            break;
          }
        }
      }
      if (!why.empty()) {
        abort_all(rank, why);
        return;
      }
    }
  }

  // "" while `c` is healthy; otherwise why not.
  static std::string check(WatchedComm& c, double timeout) {
    (void)cudaSetDevice(c.device_);
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(c.comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress)
      return detail::concat("NCCL reported an error on communicator '", c.name_, "': ",
                            ncclGetErrorString(async), " (", ncclGetLastError(c.comm_), ")");
    std::lock_guard<std::mutex> lock(c.state_mutex_);
    const Clock::time_point now = Clock::now();
    while (!c.pending_.empty()) {
      WatchedComm::Pending& head = c.pending_.front();
      const cudaError_t status = cudaEventQuery(head.done);
      if (status == cudaErrorNotReady) {
        (void)cudaGetLastError();
        const Clock::time_point since = std::max(head.issued, c.head_since_);
        if (timeout > 0 && seconds_between(since, now) > timeout)
          return detail::concat("collective ", head.seq, " on communicator '", c.name_, "' (",
                                head.what, " of ", head.bytes, " bytes) has not completed ",
                                timeout, " s after it could start: a peer rank died, hangs, "
                                "or issued different collectives (NCCL cannot say which)");
        break;
      }
      if (status != cudaSuccess)
        return detail::concat("CUDA error while watching communicator '", c.name_, "': ",
                              cudaGetErrorString(status));
      c.spare_events_.push_back(head.done);
      c.pending_.pop_front();
      c.head_since_ = now;
    }
    return "";
  }

  // Once per process: the first caller aborts (the polling thread, or abort_communicators).
  void abort_all(int rank, const std::string& why) {
    if (aborting_.exchange(true)) return;
    const std::string lost = lost_rank();
    {
      std::lock_guard<std::mutex> lock(reason_mutex_);
      reason_ = detail::concat("[rank ", rank, "] NCCL watchdog: ", why,
                               lost.empty() ? "" : "; lost: " + lost,
                               "; every NCCL communicator of this rank was aborted");
    }
    g_aborted.store(true, std::memory_order_release);  // host waits throw from here on
    std::fprintf(stderr, "fsdp: %s\n", reason().c_str());
    std::fflush(stderr);
    {
      // Held throughout, so no communicator is destroyed under the abort.
      std::lock_guard<std::mutex> lock(mutex_);
      for (WatchedComm* c : comms_) {
        (void)cudaSetDevice(c->device_);
        // Between the host's NCCL calls if it can; a host stuck inside one for this long is
        // what the abort must end, so then it aborts anyway.
        const bool locked = c->use_mutex_.try_lock_for(std::chrono::seconds(2));
        if (!c->aborted_.exchange(true)) (void)ncclCommAbort(c->comm_);
        if (locked) c->use_mutex_.unlock();
      }
    }
    if (!g_exit_when_hung.load()) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(kExitGraceSeconds));
    std::fprintf(stderr, "fsdp: error: %s (the rank did not return from its wait %g s after "
                 "the abort; exiting)\n", reason().c_str(), kExitGraceSeconds);
    std::fflush(stderr);
    std::_Exit(1);
  }

  std::mutex mutex_;
  std::vector<WatchedComm*> comms_;
  bool thread_started_ = false;
  std::mutex reason_mutex_;
  std::string reason_;
  std::atomic<bool> aborting_{false};
};

void abort_communicators(int rank, const std::string& why) { Watchdog::get().abort_now(rank, why); }

void set_collective_timeout_s(double seconds) {
  FSDP_CHECK(seconds >= 0, "the collective timeout must be >= 0 s (0: none), got ", seconds);
  g_timeout_s.store(seconds);
}
void set_exit_when_hung(bool on) { g_exit_when_hung.store(on); }
void set_lost_rank_reader(std::function<std::string(double wait_s)> reader) {
  std::lock_guard<std::mutex> lock(g_reader_mutex);
  g_lost_rank_reader = std::move(reader);
}
bool watchdog_aborted() { return g_aborted.load(std::memory_order_acquire); }

void throw_watchdog_error() { throw Error(Watchdog::get().reason()); }

double& host_waited_us() {
  thread_local double total = 0;
  return total;
}

void pause_between_polls(int polls) {
  // The first ~100 polls only yield, so a short wait costs no sleep latency; longer waits
  // (a step's worth of work) sleep 50 us between polls.
  if (polls < 100)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

// ---- WatchedComm

WatchedComm::WatchedComm(ncclComm_t comm, int device_ordinal, int global_rank, std::string name)
    : comm_(comm), device_(device_ordinal), global_rank_(global_rank), name_(std::move(name)),
      head_since_(Clock::now()) {
  Watchdog::get().add(this);
}

WatchedComm::~WatchedComm() {
  Watchdog::get().remove(this);  // the watchdog no longer touches it after this
  (void)cudaSetDevice(device_);
  std::lock_guard<std::timed_mutex> lock(use_mutex_);
  if (!aborted_.exchange(true)) {
    // Finalizing waits for queued work on it, which never ends if a peer is gone: abort then.
    ncclResult_t async = ncclSuccess;
    if (!watchdog_aborted() && ncclCommGetAsyncError(comm_, &async) == ncclSuccess &&
        async == ncclSuccess)
      (void)ncclCommDestroy(comm_);
    else
      (void)ncclCommAbort(comm_);
  }
  std::lock_guard<std::mutex> state(state_mutex_);
  for (const Pending& p : pending_) (void)cudaEventDestroy(p.done);
  for (cudaEvent_t e : spare_events_) (void)cudaEventDestroy(e);
}

void WatchedComm::throw_if_aborted() const {
  if (aborted_ || watchdog_aborted()) throw_watchdog_error();
}

void WatchedComm::track(cudaStream_t stream, const char* what, int64_t bytes) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    (void)cudaGetLastError();
    return;  // a captured collective goes unwatched: its event could not be queried
  }
  std::lock_guard<std::mutex> lock(state_mutex_);
  cudaEvent_t done = nullptr;
  if (!spare_events_.empty()) {
    done = spare_events_.front();
    spare_events_.pop_front();
  } else if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
    FSDP_FAIL("cannot create an event for the NCCL watchdog: ",
              cudaGetErrorString(cudaGetLastError()));
  }
  if (cudaEventRecord(done, stream) != cudaSuccess) {
    spare_events_.push_back(done);
    FSDP_FAIL("cannot record an event for the NCCL watchdog: ",
              cudaGetErrorString(cudaGetLastError()));
  }
  if (pending_.empty()) head_since_ = Clock::now();
  pending_.push_back({done, next_seq_++, what, bytes, Clock::now()});
}

}  // namespace fsdp::cuda
