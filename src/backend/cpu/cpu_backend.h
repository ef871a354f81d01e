// The CPU backend: ranks are threads of one process, each stream is a worker thread.
// See Note [CPU backend] in cpu_device.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/comm.h"
#include "fsdp/device.h"

namespace fsdp::cpu {

// The collective timeout when CpuOptions does not set one: 60 s, or the value of the
// environment variable FSDP_CPU_COLLECTIVE_TIMEOUT_S (seconds) when that is set; ctest sets
// 20 for the tests.
double default_collective_timeout_s();

struct CpuOptions {
  // Checked mode: freed memory is filled with NaN and quarantined (not reused for a while),
  // so a read after an early free shows up as NaN in the results, and a write into it is
  // reported when it leaves quarantine or at the next device-wide synchronize.
  bool checked = true;
  // How many freed bytes checked mode keeps in quarantine before it gives the oldest back.
  size_t quarantine_bytes = size_t{256} << 20;
  // Chaos mode: random delays (0..chaos_max_us) before stream ops and collective phases.
  bool chaos = false;
  uint64_t chaos_seed = 0;
  int chaos_max_us = 300;
  // A simulated link: each collective takes at least (bytes this rank receives) / link_gbps
  // (GB/s), so tests can make communication slow relative to compute. 0: as fast as memcpy.
  double link_gbps = 0;
  // Simulated time: spins, the link and chaos delays advance a virtual clock instead of
  // sleeping, and the timeline reports it. See Note [Virtual clock] in cpu_virtual_clock.cpp.
  bool virtual_clock = false;
  // A collective (or split) that waits longer than this, in wall-clock seconds, for its peers
  // fails with an error naming the communicator, its sequence number and the ranks that did
  // not arrive, instead of hanging. 0: wait forever.
  double collective_timeout_s = default_collective_timeout_s();
  // Each rank's device memory: an allocation past it fails as on a full GPU (Note [Out of
  // memory] in include/fsdp/out_of_memory.h). 0: no limit but the host's.
  size_t memory_capacity_bytes = 0;
};

// State shared by the rank threads of one launch: the in-process "network".
class CpuWorld {
 public:
  CpuWorld(int world_size, CpuOptions options);
  ~CpuWorld();
  int size() const;
  const CpuOptions& options() const;
  std::unique_ptr<Device> make_device(int rank);
  // The communicator over all ranks; `device` must be the one made for `rank`.
  std::unique_ptr<Comm> make_world_comm(int rank, Device& device);
  // Wakes every rank blocked in a collective or an event wait; they throw fsdp::Error.
  // The launcher calls it when one rank fails, so the others end instead of hanging.
  void abort(const std::string& why);
  bool aborted() const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::cpu
