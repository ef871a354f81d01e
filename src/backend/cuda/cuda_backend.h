// The CUDA + NCCL backend. This header is plain C++: no CUDA or NCCL header appears outside
// src/backend/cuda/ (README.md, Layout).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fsdp/comm.h"
#include "fsdp/device.h"
#include "fsdp/launch.h"

namespace fsdp::cuda {

// True when this binary was built with the CUDA backend (FSDP_WITH_CUDA).
bool compiled_with_cuda();
// The CUDA runtime and NCCL versions this binary was built against ("CUDA 13.0, NCCL
// 2.27.7"), or that it was built without them. Never initializes CUDA.
std::string build_versions();
// Number of visible GPUs; 0 when none or when the driver is missing. Never throws.
// Note: this initializes CUDA in the calling process; a launcher that forks one process per
// GPU must not call it before fork() (ask the environment, or a child process, instead).
int device_count();
// GPU `gpu`'s memory in bytes, as cudaMemGetInfo gives it: free (after this process's
// context) and total; both 0 when unknown. Never throws; it initializes CUDA as device_count
// does.
GpuMemory device_memory(int gpu);

struct UniqueId {
  std::array<char, 128> bytes{};
};
UniqueId make_unique_id();  // ncclGetUniqueId; safe before fork (does not initialize CUDA)

// Note [NCCL watchdog] (nccl_watchdog.cpp): a collective that has not completed this many
// seconds after it could start, or an asynchronous NCCL error, aborts every communicator of
// the process, and the rank's blocked calls fail with an error saying so. 0: never. Default
// 60. A launcher sets it before it forks the ranks.
void set_collective_timeout_s(double seconds);
// In a process that is one rank (the launchers' children, torchrun's ranks): if the host has
// not returned from its blocked call some seconds after the watchdog aborted, the watchdog
// prints the error and exits the process with status 1 itself, so a rank never outlives the
// bound. Off by default (a library caller keeps its process).
void set_exit_when_hung(bool on);
// Who was lost, for the watchdog's error: called once when it fires, allowed to wait up to
// `wait_s` seconds, returns e.g. "rank 1 was killed by signal 9 (Killed)", or "" when nobody
// knows. A launcher whose ranks share a store sets it to read the failure notice there.
void set_lost_rank_reader(std::function<std::string(double wait_s)> reader);
// Aborts every watched communicator now, as a collective timeout would, with `why` in the
// error (Note [Failure notices]: another rank reported its failure). Once per process; it
// blocks for as long as the watchdog's abort does (run it on a thread of its own).
void abort_communicators(int rank, const std::string& why);

std::unique_ptr<Device> make_device(int local_rank);
std::unique_ptr<Comm> make_world_comm(Device& device, const UniqueId& id, int rank, int world);

}  // namespace fsdp::cuda
