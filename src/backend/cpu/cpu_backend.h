// The CPU backend: ranks are threads of one process, each stream is a worker thread.
// See Note [CPU backend] in cpu_device.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fsdp/comm.h"
#include "fsdp/device.h"

namespace fsdp::cpu {

struct CpuOptions {
  // Checked mode: freed memory is filled with NaN and quarantined (not reused for a while),
  // so a read after an early free shows up as NaN in the results.
  bool checked = true;
  // Chaos mode: random delays (0..chaos_max_us) before stream ops and collective phases.
  bool chaos = false;
  uint64_t chaos_seed = 0;
  int chaos_max_us = 300;
  // A simulated link: each collective takes at least (bytes this rank receives) / link_gbps
  // (GB/s), so tests can make communication slow relative to compute. 0: as fast as memcpy.
  double link_gbps = 0;
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
