// The reduce-scatter input ring (docs/design.md, "The reduce-scatter ring").
//
// Note [RS ring]
// One ring per root, shared by every param group of every unit. Before a group allocates
// its RS input it calls reserve(): while k buffers are alive, the oldest is reclaimed: the
// compute stream waits on that entry's RS-done event, then the buffer is freed on the
// compute stream (stream-ordered, so the free lands after the RS read it; no record_stream).
// The bound is enforced where a buffer is created, so it holds whatever order the groups'
// post-backward hooks fire in. Entries are FIFO: the one RS stream finishes them in order.
// We allocate a fresh buffer per RS rather than keeping a persistent pool of k buffers: the
// groups differ in size (dense vs experts), and a stream-ordered allocator reuses the freed
// block at no cost, so a pool would only pin k x the largest group for the whole run.
#pragma once

#include <deque>
#include <vector>

#include "fsdp/device.h"
#include "fsdp/fsdp.h"
#include "fsdp/tensor.h"

namespace fsdp::core {

class EventPool;

class RsRing {
 public:
  struct Entry {
    void* buffer = nullptr;
    Event done;       // recorded on the RS stream after the RS (and its accumulation)
    int group_index;  // the group's index within its module (for the 2.12 policy)
    // Set when the buffer is a grad's own storage (Note [One-rank reduce-scatter]): reclaiming
    // drops it, which frees it on compute like any other entry.
    std::shared_ptr<Storage> owner = nullptr;
  };

  void set_capacity(int k);
  int capacity() const { return k_; }
  void set_policy(RsReclaimPolicy p) { policy_ = p; }
  RsReclaimPolicy policy() const { return policy_; }

  // Before a group with `group_index` of `group_count` allocates its RS input.
  void reserve(Device& device, Stream compute, EventPool& events, int group_index,
               int group_count);
  void push(Entry e) { live_.push_back(e); }
  // Root finalize: every entry reclaimed; the ring is empty afterwards.
  void drain(Device& device, Stream compute, EventPool& events);
  size_t size() const { return live_.size(); }

 private:
  void reclaim_oldest(Device& device, Stream compute, EventPool& events);

  std::deque<Entry> live_;
  int k_ = 1;
  RsReclaimPolicy policy_ = RsReclaimPolicy::BoundedRing;
};

// Events are reused: an entry's event returns to the pool once a wait on it was issued
// (a later record does not disturb a wait already issued; Note [Stream semantics]).
class EventPool {
 public:
  explicit EventPool(Device& device) : device_(&device) {}
  ~EventPool();
  Event acquire();
  void release(Event e) { free_.push_back(e); }

 private:
  Device* device_;
  std::vector<Event> free_;
  std::vector<Event> all_;
};

}  // namespace fsdp::core
