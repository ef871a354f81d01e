#include "core/rs_ring.h"

#include "fsdp/error.h"

namespace fsdp::core {

// k was checked where the API takes it (check_reduce_scatter_max_input_buffers).
void RsRing::set_capacity(int k) { k_ = k; }

void RsRing::reclaim_oldest(Device& device, Stream compute, EventPool& events) {
  Entry oldest = live_.front();
  live_.pop_front();
  device.wait_event(compute, oldest.done);  // the RS that read the buffer has finished
  if (oldest.owner)
    oldest.owner.reset();  // the grad's storage, allocated and freed on compute
  else
    device.free(oldest.buffer, compute);  // stream-ordered: after that wait
  events.release(oldest.done);
}

void RsRing::reserve(Device& device, Stream compute, EventPool& events, int group_index,
                     int group_count) {
  if (policy_ == RsReclaimPolicy::BoundedRing) {
    while (static_cast<int>(live_.size()) >= k_) reclaim_oldest(device, compute, events);
    return;
  }
  // FSDP2 2.12 (#177319): only the group with the last index drains the shared list, and it
  // drains all of it. Correct only if that group fires first in every module.
  if (group_index == group_count - 1)
    while (!live_.empty()) reclaim_oldest(device, compute, events);
}

void RsRing::drain(Device& device, Stream compute, EventPool& events) {
  while (!live_.empty()) reclaim_oldest(device, compute, events);
}

EventPool::~EventPool() {
  for (Event e : all_) device_->destroy_event(e);
}

Event EventPool::acquire() {
  if (free_.empty()) {
    Event e = device_->create_event();
    all_.push_back(e);
    return e;
  }
  Event e = free_.back();
  free_.pop_back();
  return e;
}

}  // namespace fsdp::core
