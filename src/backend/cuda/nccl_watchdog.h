// The NCCL watchdog (Note [NCCL watchdog] in nccl_watchdog.cpp): communicators it watches,
// and the host waits that it can interrupt.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

namespace fsdp::cuda {

// One NCCL communicator under the watchdog. It owns the communicator: the destructor
// finalizes it, or, after an abort or an asynchronous error, leaves it aborted.
class WatchedComm {
 public:
  WatchedComm(ncclComm_t comm, int device_ordinal, int global_rank, std::string name);
  ~WatchedComm();
  WatchedComm(const WatchedComm&) = delete;
  WatchedComm& operator=(const WatchedComm&) = delete;

  // Runs `enqueue(comm)` (NCCL calls on this communicator, enqueued on `stream`), then
  // records when the work completes, for the watchdog. Throws the watchdog's error instead if
  // it has aborted the communicators.
  template <typename Enqueue>
  void collective(cudaStream_t stream, const char* what, int64_t bytes, Enqueue&& enqueue) {
    {
      std::lock_guard<std::timed_mutex> lock(use_mutex_);
      throw_if_aborted();
      enqueue(comm_);
    }
    track(stream, what, bytes);
  }
  // For calls that are not collectives on a stream (split): under the same guard.
  template <typename Call>
  auto call(Call&& fn) {
    std::lock_guard<std::timed_mutex> lock(use_mutex_);
    throw_if_aborted();
    return fn(comm_);
  }

 private:
  friend class Watchdog;
  struct Pending {
    cudaEvent_t done;
    int64_t seq;
    const char* what;
    int64_t bytes;
    std::chrono::steady_clock::time_point issued;
  };
  void track(cudaStream_t stream, const char* what, int64_t bytes);
  void throw_if_aborted() const;

  ncclComm_t comm_;
  const int device_;
  const int global_rank_;
  const std::string name_;
  // Held by the host while it calls into NCCL, and by the watchdog to abort between calls.
  std::timed_mutex use_mutex_;
  std::atomic<bool> aborted_{false};  // by the watchdog, or by the destructor
  // Guards what the watchdog polls (never held across an NCCL call).
  std::mutex state_mutex_;
  std::deque<Pending> pending_;
  std::deque<cudaEvent_t> spare_events_;
  int64_t next_seq_ = 0;
  // When the oldest pending collective could start: the completion of the one before it.
  std::chrono::steady_clock::time_point head_since_;
};

// True once the watchdog has aborted (after a timeout or an NCCL error); then every
// communicator of the process is aborted and host waits fail.
bool watchdog_aborted();

// Waits until `query()` (cudaStreamQuery, cudaEventQuery) stops answering
// cudaErrorNotReady, polling, so that a watchdog abort can end the wait: it then throws the
// watchdog's error. Returns the query's last answer (cudaSuccess or an error to check).
template <typename Query>
cudaError_t poll_until_ready(Query&& query);

void throw_watchdog_error();  // raises the watchdog's error (after watchdog_aborted())
void pause_between_polls(int polls);  // yields at first, then sleeps a little

// Microseconds this thread has spent in poll_until_ready waiting for the device (the host's
// time per step counts only its own work: Device::host_wait_us).
double& host_waited_us();

template <typename Query>
cudaError_t poll_until_ready(Query&& query) {
  std::chrono::steady_clock::time_point since{};
  for (int polls = 0;; ++polls) {
    const cudaError_t status = query();
    if (status != cudaErrorNotReady) {
      if (polls > 0)
        host_waited_us() +=
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - since)
                .count();
      return status;
    }
    if (polls == 0) since = std::chrono::steady_clock::now();
    (void)cudaGetLastError();  // "not ready" is an answer, not an error for the next check
    if (watchdog_aborted()) throw_watchdog_error();
    pause_between_polls(polls);
  }
}

}  // namespace fsdp::cuda
