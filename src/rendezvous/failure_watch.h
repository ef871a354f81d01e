// Note [Failure notices], for back-ends whose collectives cannot see a peer die: NCCL's kernels
// wait for data that never comes, and only the watchdog's timeout (Note [NCCL watchdog]) would
// end them. A FailureWatch reads the job's store on a thread of its own, every `interval`, and
// calls `on_failure` once with the first notice of another rank; then it stops. A notice of
// this rank's own is not news to it. A store that stops answering is not a failure to report:
// at the job's normal end the store's host may simply be done first.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "rendezvous/failure_notice.h"

namespace fsdp::rendezvous {

class FailureWatch {
 public:
  FailureWatch(std::shared_ptr<Store> store, int rank, Millis interval,
               std::function<void(const FailureNotice&)> on_failure);
  // Stops the thread and waits for it (at most one read of the store).
  ~FailureWatch();
  FailureWatch(const FailureWatch&) = delete;
  FailureWatch& operator=(const FailureWatch&) = delete;

 private:
  void run();

  std::shared_ptr<Store> store_;
  int rank_;
  Millis interval_;
  std::function<void(const FailureNotice&)> on_failure_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace fsdp::rendezvous
