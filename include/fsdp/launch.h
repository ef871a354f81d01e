// Starting ranks: threads of this process (or processes, over Gloo) on the CPU backend, one
// process per GPU on CUDA
// (or one rank per process under an external launcher such as torchrun).
//
//   fsdp::run_cpu_ranks(4, [](int rank, fsdp::Device& device, std::shared_ptr<fsdp::Comm> world) {
//     fsdp::Mesh mesh("dp", device, world);
//     ...  // build the model, fully_shard it, train
//   });
//
// The body runs once per rank with that rank's device and the communicator over all ranks.
// If any rank throws, the launch stops the others (instead of letting them wait forever in a
// collective) and reports the failure as an fsdp::Error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/comm.h"
#include "fsdp/device.h"

namespace fsdp {

using RankBody = std::function<void(int rank, Device& device, std::shared_ptr<Comm> world)>;
// A rank body that hands a result back to the launching process (any bytes: JSON, text...).
using RankBodyWithResult =
    std::function<std::string(int rank, Device& device, std::shared_ptr<Comm> world)>;

// ---- CPU backend: ranks are threads of this process, streams are worker threads.
struct CpuLaunchOptions {
  // Freed memory is filled with NaN and kept out of reuse for a while, so a read after an
  // early free shows up as NaN in the results.
  bool checked = true;
  // Random delays (0..chaos_max_us) before stream ops and collective phases, seeded.
  bool chaos = false;
  uint64_t chaos_seed = 0;
  int chaos_max_us = 300;
  // A simulated link of this many GB/s for the collectives; 0: as fast as memcpy.
  double link_gbps = 0;
};

// Runs `body` on `world_size` rank threads and returns when all have finished. The first
// error of any rank is rethrown here, after the other ranks have been stopped.
void run_cpu_ranks(int world_size, const RankBody& body, const CpuLaunchOptions& options = {});

// ---- CPU backend, ranks as processes: each rank is a process with its own CPU device, and
// the ranks exchange data with Gloo over TCP (docs/cpu_processes.md). Needs a build with
// Gloo (cpu_processes_built()).
bool cpu_processes_built();

struct CpuProcessOptions {
  CpuLaunchOptions cpu;  // checked mode, chaos delays (seeded per rank as with threads)
  // Every collective and every rendezvous wait fails after this many seconds; a rank that
  // dies ends the others with an error naming it, never a hang.
  double timeout_s = 60;
  // Several hosts: `nnodes` launchers, one per host, each starting `nproc` ranks
  // (node_rank * nproc ...); they meet at master_addr:master_port, which node 0's launcher
  // hosts. One host: master_port 0 picks a free port.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
};

struct CpuProcessLaunch {
  int world_size = 0;
  int first_rank = 0;                // the global rank of this host's first process
  std::vector<std::string> results;  // this host's ranks' results, in rank order
};

// Forks `nproc` processes on this host, one rank each, and waits for them. If one fails or
// dies, the others are stopped and an fsdp::Error names the first failure ("rank 2 was
// killed by signal 9 (Killed)"). Call it before this process starts threads of its own.
CpuProcessLaunch run_cpu_processes_with_results(int nproc, const RankBodyWithResult& body,
                                                const CpuProcessOptions& options = {});
// The same without results; returns the world size.
int run_cpu_processes(int nproc, const RankBody& body, const CpuProcessOptions& options = {});

// ---- CUDA backend (built when nvcc and NCCL were found; see cuda_backend_built()).
bool cuda_backend_built();
// GPUs this process could use, counted without initializing CUDA here (so it can still
// fork one process per GPU afterwards). 0 without the CUDA backend or without a GPU.
int visible_gpu_count();
// True when an external launcher started this process as one rank: RANK and WORLD_SIZE are
// set (torchrun also sets LOCAL_RANK, MASTER_ADDR and MASTER_PORT).
bool under_external_launcher();

struct CudaLaunch {
  int world_size = 0;  // ranks in the whole job
  // Under an external launcher: this process's rank, and results holds only its result.
  // Otherwise -1, and results holds every rank's result in rank order.
  int this_rank = -1;
  std::vector<std::string> results;
};

// Under an external launcher (RANK, WORLD_SIZE set), runs `body` once as this process's rank
// on GPU LOCAL_RANK; rank 0 hands the NCCL id to the others over TCP at MASTER_ADDR,
// port MASTER_PORT + 1. Otherwise forks `nproc` processes (0: one per visible GPU), one per
// GPU, and waits for them; if one fails the others are stopped and an fsdp::Error is thrown.
// The calling process must not have used CUDA before (see Note [Launching on GPUs]).
CudaLaunch run_cuda_ranks_with_results(int nproc, const RankBodyWithResult& body);
// The same without results; returns the world size.
int run_cuda_ranks(int nproc, const RankBody& body);

}  // namespace fsdp
