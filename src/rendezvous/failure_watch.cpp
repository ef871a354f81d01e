// See failure_watch.h.
#include "rendezvous/failure_watch.h"

namespace fsdp::rendezvous {

FailureWatch::FailureWatch(std::shared_ptr<Store> store, int rank, Millis interval,
                           std::function<void(const FailureNotice&)> on_failure)
    : store_(std::move(store)), rank_(rank), interval_(interval),
      on_failure_(std::move(on_failure)), thread_([this] { run(); }) {}

FailureWatch::~FailureWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void FailureWatch::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (wake_.wait_for(lock, interval_, [this] { return stopping_; })) return;
    lock.unlock();
    const std::optional<FailureNotice> notice = read_failure(*store_, Millis(0));
    if (notice && notice->rank != rank_) {
      on_failure_(*notice);
      return;
    }
    lock.lock();
  }
}

}  // namespace fsdp::rendezvous
