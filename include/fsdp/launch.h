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
#include <optional>
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
  // This process is one rank of torchrun, srun or mpirun (their environment variables say
  // which): nproc and the placement above are ignored, and results holds this rank's only.
  bool external = false;
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
// The first visible GPU's memory in bytes, asked the same way (a child process): what a
// fresh process finds free there (its own context and other processes' memory taken), and the
// card's total. Both 0 when unknown.
struct GpuMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
GpuMemory visible_gpu_memory();
// True when an external launcher started this process as one rank: torchrun (RANK and
// WORLD_SIZE set), srun (SLURM_PROCID, SLURM_NTASKS) or mpirun (OMPI_COMM_WORLD_RANK/SIZE,
// PMI_RANK/PMI_SIZE). See docs/launch.md.
bool under_external_launcher();

// How the ranks of a GPU job start and meet (docs/launch.md). Unset fields come from the
// environment (MASTER_ADDR, MASTER_PORT, a launcher's variables) or mean one node.
struct LaunchOptions {
  // Processes this node forks, one per GPU (0: every visible GPU). Given (> 0) under torchrun
  // it is an error: torchrun already started one process per rank.
  int nproc = 0;
  // Several nodes: each runs the same program with its own node_rank; node 0 hosts the
  // rendezvous store at master_addr:master_port and every rank meets there.
  std::optional<int> nnodes, node_rank, master_port;
  std::optional<std::string> master_addr;
  // Every rendezvous wait (connecting to the store, the NCCL id, all ranks arriving) ends
  // after this long with an error naming what is missing.
  double timeout_s = 60;
};

struct CudaLaunch {
  int world_size = 0;  // ranks in the whole job
  // Under an external launcher: this process's rank; otherwise -1.
  int this_rank = -1;
  // The results of the ranks this process ran, in rank order from first_rank: every rank of
  // the job on one node, this node's ranks on several, this process's rank under an
  // external launcher.
  int first_rank = 0;
  std::vector<std::string> results;
};

// Under an external launcher, runs `body` once as this process's rank on GPU LOCAL_RANK.
// Otherwise forks `nproc` processes on this node (0: one per visible GPU) and waits for them;
// if one fails the others are stopped and an fsdp::Error is thrown. Either way the ranks meet
// at the rendezvous store (Note [Launching on GPUs]): rank 0 puts the NCCL id there, and all
// wait for each other there (at most options.timeout_s) before NCCL starts.
// The calling process must not have used CUDA before (see Note [Launching on GPUs]).
CudaLaunch run_cuda_ranks_with_results(const LaunchOptions& options,
                                       const RankBodyWithResult& body);
// The same with only `nproc` given (ignored under an external launcher).
CudaLaunch run_cuda_ranks_with_results(int nproc, const RankBodyWithResult& body);
// The same without results; returns the world size.
int run_cuda_ranks(int nproc, const RankBody& body);

}  // namespace fsdp
