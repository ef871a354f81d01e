// Note [Launching on GPUs]
// fork() per GPU works only if the parent never touched CUDA (the children then fail with
// "initialization error"). So the parent asks a throwaway child for the GPU count, then forks
// one child per GPU (launch::run_node_ranks). Each child runs its rank and writes the body's
// result into a file that the parent reads back.
// Ranks meet at the rendezvous store (src/rendezvous, docs/launch.md), never on a port of
// their own: rank 0 makes the NCCL unique id and sets it there; every rank then waits in a
// store barrier, which names the ranks that never arrived when the timeout passes, before it
// reads the id and enters ncclCommInitRank (which would wait forever for a missing rank).
// Who hosts the store (launch::LaunchEnv::hosts_store):
//  - fsdp forks the ranks (--nproc, and on each node of --nnodes): the parent of node 0
//    hosts it, on a free port for one node or on --master-port for several. It listens
//    before the forks but serves only after them, and each child closes its copy of the
//    listening socket, so the store dies with the parent and not later;
//  - torchrun: its agent already serves a store on MASTER_PORT
//    (TORCHELASTIC_USE_AGENT_STORE=True); every rank joins it (Note [TCP store protocol]).
//    Without the agent store, rank 0 hosts ours on MASTER_PORT, which is then free;
//  - srun, mpirun: rank 0 hosts it on MASTER_PORT at MASTER_ADDR (or SLURM's first node).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"
#include "fsdp/launch.h"
#include "launch/launch_env.h"
#include "launch/node_ranks.h"
#include "rendezvous/failure_notice.h"
#include "rendezvous/failure_watch.h"
#include "rendezvous/tcp_store.h"

namespace fsdp {

namespace {

using rendezvous::Millis;

// run_one_rank's work: joins the others at `store` (this run's keys), gets the NCCL id from
// rank 0, and runs the body.
std::string run_one_rank_body(const launch::LaunchEnv& e, int gpu, rendezvous::Store& store,
                              Millis timeout, const RankBodyWithResult& body) {
  std::unique_ptr<Device> device = cuda::make_device(gpu);
  cuda::UniqueId id;
  if (e.rank == 0) {
    id = cuda::make_unique_id();
    store.set("nccl_id", std::string(id.bytes.data(), id.bytes.size()));
  }
  store.barrier("start", e.rank, e.world_size, timeout);
  if (e.rank != 0) {
    const std::string got = store.get("nccl_id", timeout);
    FSDP_CHECK(got.size() == id.bytes.size(), "the NCCL id from rank 0 has ", got.size(),
               " bytes, not ", id.bytes.size());
    std::memcpy(id.bytes.data(), got.data(), got.size());
  }
  std::shared_ptr<Comm> comm = cuda::make_world_comm(*device, id, e.rank, e.world_size);
  std::string result = body(e.rank, *device, comm);
  device->synchronize();
  comm.reset();
  return result;
}

// Runs the body as `e.rank` (run_one_rank_body) among this run's keys of `base`, where the
// job's failure notices are read and posted. `gpu` is the device index in this process (the
// local rank unless a launcher left each process a single GPU).
std::string run_one_rank(const launch::LaunchEnv& e, int gpu, rendezvous::Store& base,
                         Millis timeout, const RankBodyWithResult& body) {
  this_thread_identity() = {e.rank, "cuda:" + std::to_string(gpu)};
  cuda::set_exit_when_hung(true);  // this process is one rank (Note [NCCL watchdog])
  auto store = std::make_shared<rendezvous::PrefixStore>(
      launch::run_key_prefix(e, "cuda"), std::shared_ptr<rendezvous::Store>(&base, [](auto*) {}));
  // Note [Failure notices]: this rank's own error is posted for the others; another rank's
  // notice aborts this rank's communicators at once (NCCL would wait for the dead peer until
  // the watchdog's timeout), and the watchdog's error names the lost rank from it.
  cuda::set_lost_rank_reader([store](double wait_s) -> std::string {
    const auto notice = rendezvous::read_failure(
        *store, Millis(static_cast<int64_t>(wait_s * 1000)));
    return notice ? notice->message : "";
  });
  struct ClearReader {
    ~ClearReader() { cuda::set_lost_rank_reader(nullptr); }
  } clear_reader;
  std::unique_ptr<rendezvous::FailureWatch> watch;
  if (e.world_size > 1)
    watch = std::make_unique<rendezvous::FailureWatch>(
        store, e.rank, Millis(1000), [rank = e.rank](const rendezvous::FailureNotice& n) {
          // On a thread of its own: the abort blocks while the rank's host wait unwinds.
          std::thread([rank, lost = n.rank] {
            cuda::abort_communicators(rank, detail::concat("rank ", lost, " reported a failure "
                                                           "in the job's store"));
          }).detach();
        });
  try {
    return run_one_rank_body(e, gpu, *store, timeout, body);
  } catch (const std::exception& err) {
    rendezvous::post_failure(*store, {e.rank, detail::concat("rank ", e.rank, " failed: ", err.what())});
    throw;
  }
}

Millis timeout_of(const LaunchOptions& o) {
  FSDP_USER_CHECK(o.timeout_s > 0 && o.timeout_s <= 1e6, "the rendezvous timeout must be in (0, "
                  "1e6] seconds, got ", o.timeout_s);
  return Millis(static_cast<int64_t>(o.timeout_s * 1000));
}

launch::LaunchFlags flags_of(const LaunchOptions& o) {
  launch::LaunchFlags f;
  if (o.nproc > 0) f.nproc = o.nproc;
  f.nnodes = o.nnodes;
  f.node_rank = o.node_rank;
  f.master_port = o.master_port;
  f.master_addr = o.master_addr;
  return f;
}

// torchrun, srun, mpirun: this process is one rank.
CudaLaunch run_as_one_rank(const launch::LaunchEnv& e, Millis timeout,
                           const RankBodyWithResult& body) {
  // srun --gpus-per-task=1 (or CUDA_VISIBLE_DEVICES set per rank) leaves each process one
  // GPU, its device 0; otherwise the process takes GPU LOCAL_RANK of the node's. Nothing
  // forks after this, so counting the GPUs here (which initializes CUDA) is safe.
  const int gpus = cuda::device_count();
  FSDP_USER_CHECK(gpus > 0, e.describe(), ": no CUDA GPU is visible to this process");
  FSDP_USER_CHECK(gpus == 1 || e.local_rank < gpus, e.describe(), ": local rank ", e.local_rank,
                  " needs GPU ", e.local_rank, " but this process sees ", gpus, " GPUs");
  const int gpu = gpus == 1 ? 0 : e.local_rank;
  rendezvous::HostedStore hosted = launch::open_rank_store(e, timeout);
  launch::arm_failure_notice(e, hosted, "cuda");
  CudaLaunch launch;
  launch.world_size = e.world_size;
  launch.this_rank = launch.first_rank = e.rank;
  launch.results.push_back(run_one_rank(e, gpu, *hosted.store, timeout, body));
  return launch;
}

}  // namespace

bool cuda_backend_built() { return cuda::compiled_with_cuda(); }

int visible_gpu_count() {
  if (!cuda::compiled_with_cuda()) return 0;
  pid_t pid = ::fork();
  if (pid == 0) _exit(std::min(cuda::device_count(), 100));
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

GpuMemory visible_gpu_memory() {
  if (!cuda::compiled_with_cuda()) return {};
  int fds[2];
  if (::pipe(fds) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const GpuMemory m = cuda::device_memory(0);
    const int64_t bytes[2] = {m.free_bytes, m.total_bytes};
    const bool written = ::write(fds[1], bytes, sizeof bytes) == sizeof bytes;
    _exit(written ? 0 : 1);
  }
  ::close(fds[1]);
  int64_t bytes[2] = {0, 0};
  const bool read_all = pid > 0 && ::read(fds[0], bytes, sizeof bytes) == sizeof bytes;
  ::close(fds[0]);
  int status = 0;
  if (pid > 0) ::waitpid(pid, &status, 0);
  // A child that read nothing sensible (free beyond total) answers "unknown".
  if (!read_all || bytes[0] <= 0 || bytes[1] < bytes[0]) return {};
  return {bytes[0], bytes[1]};
}

bool under_external_launcher() {
  return launch::detect_launcher({}) != launch::Launcher::Fsdp;
}

CudaLaunch run_cuda_ranks_with_results(const LaunchOptions& options,
                                       const RankBodyWithResult& body) {
  FSDP_CHECK(cuda::compiled_with_cuda(),
             "this build has no CUDA backend (configure with nvcc and NCCL present)");
  const Millis timeout = timeout_of(options);
  // The bound on a collective too (Note [NCCL watchdog]); set before the ranks fork.
  cuda::set_collective_timeout_s(options.timeout_s);
  launch::LaunchFlags flags = flags_of(options);
  if (launch::detect_launcher(flags) != launch::Launcher::Fsdp)
    return run_as_one_rank(launch::resolve_launch(flags), timeout, body);
  FSDP_CHECK(options.nproc >= 0, "the number of processes must be >= 0 (0: one per GPU), got ",
             options.nproc);
  const int gpus = visible_gpu_count();
  FSDP_CHECK(gpus > 0, "no CUDA GPU is visible");
  const int local = options.nproc > 0 ? options.nproc : gpus;
  FSDP_CHECK(local <= gpus, local, " processes were asked for but only ", gpus,
             " GPUs are visible");
  flags.nproc = local;
  const launch::LaunchEnv node = launch::resolve_launch(flags);
  CudaLaunch launch;
  launch.world_size = node.world_size;
  launch.first_rank = node.rank;
  launch.results = launch::run_node_ranks(
      node, timeout, [&](const launch::LaunchEnv& e, rendezvous::Store& store) {
        return run_one_rank(e, e.local_rank, store, timeout, body);
      });
  return launch;
}

CudaLaunch run_cuda_ranks_with_results(int nproc, const RankBodyWithResult& body) {
  LaunchOptions options;
  if (!under_external_launcher()) options.nproc = nproc;
  return run_cuda_ranks_with_results(options, body);
}

int run_cuda_ranks(int nproc, const RankBody& body) {
  return run_cuda_ranks_with_results(nproc, [&](int rank, Device& device,
                                                std::shared_ptr<Comm> world) {
           body(rank, device, std::move(world));
           return std::string();
         }).world_size;
}

}  // namespace fsdp
