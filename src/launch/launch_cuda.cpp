// Note [Launching on GPUs]
// fork() per GPU works only if the parent never touched CUDA (the children then fail with
// "initialization error"). So the parent asks a throwaway child for the GPU count, then forks
// one child per GPU. Each child runs its rank and writes the body's result into a file that
// the parent reads back.
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
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"
#include "fsdp/launch.h"
#include "launch/launch_env.h"
#include "rendezvous/tcp_store.h"

namespace fsdp {

namespace {

using rendezvous::Millis;

// Joins the others at the store, gets the NCCL id from rank 0, and runs the body as `e.rank`.
std::string run_one_rank(const launch::LaunchEnv& e, rendezvous::Store& base, Millis timeout,
                         const RankBodyWithResult& body) {
  this_thread_identity() = {e.rank, "cuda:" + std::to_string(e.local_rank)};
  // Keys of this run only: torchrun's store outlives a restart.
  rendezvous::PrefixStore store("fsdp/" + e.run_id + "/cuda",
                                std::shared_ptr<rendezvous::Store>(&base, [](auto*) {}));
  std::unique_ptr<Device> device = cuda::make_device(e.local_rank);
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
  rendezvous::HostedStore hosted =
      rendezvous::host_or_join_tcp_store(e.hosts_store(), e.master_addr, e.master_port, timeout);
  CudaLaunch launch;
  launch.world_size = e.world_size;
  launch.this_rank = launch.first_rank = e.rank;
  launch.results.push_back(run_one_rank(e, *hosted.store, timeout, body));
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

bool under_external_launcher() {
  return launch::detect_launcher({}) != launch::Launcher::Fsdp;
}

CudaLaunch run_cuda_ranks_with_results(const LaunchOptions& options,
                                       const RankBodyWithResult& body) {
  FSDP_CHECK(cuda::compiled_with_cuda(),
             "this build has no CUDA backend (configure with nvcc and NCCL present)");
  const Millis timeout = timeout_of(options);
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
  // Node 0's parent hosts the store; it serves once every child is forked (Note [Launching on
  // GPUs]), and outlives its ranks, so a rank that dies cannot take the store with it.
  std::unique_ptr<rendezvous::TcpStoreServer> server;
  int port = node.master_port;
  if (node.hosts_store()) {
    server = std::make_unique<rendezvous::TcpStoreServer>(node.master_port, /*start=*/false);
    port = server->port();
  }
  const std::string store_host = server ? "127.0.0.1" : node.master_addr;
  CudaLaunch launch;
  launch.world_size = node.world_size;
  launch.first_rank = node.rank;
  // Each child writes its result (which can be large) to a file here.
  char dir_template[] = "/tmp/fsdp-ranks-XXXXXX";
  FSDP_CHECK(::mkdtemp(dir_template), "cannot make a temporary directory: ", std::strerror(errno));
  const std::string dir = dir_template;
  auto result_path = [&](int local_rank) {
    return dir + "/rank" + std::to_string(local_rank) + ".out";
  };
  std::vector<pid_t> pids;
  std::fflush(stdout);
  std::fflush(stderr);
  for (int local_rank = 0; local_rank < local; ++local_rank) {
    pid_t pid = ::fork();
    FSDP_CHECK(pid >= 0, "fork failed");
    if (pid == 0) {
      int code = 0;
      try {
        if (server) server->close_in_child();
        const launch::LaunchEnv e = launch::for_local_rank(node, local_rank);
        this_thread_identity() = {e.rank, "cuda:" + std::to_string(local_rank)};
        rendezvous::TcpStore store({store_host, port, timeout});
        const std::string result = run_one_rank(e, store, timeout, body);
        std::ofstream(result_path(local_rank), std::ios::binary) << result;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "fsdp: error: %s\n", e.what());
        code = 1;
      }
      std::fflush(stdout);
      std::_Exit(code);  // a child must not run the parent's atexit handlers
    }
    pids.push_back(pid);
  }
  if (server) server->start();
  // Wait for every child; if one fails, the others would wait in NCCL forever: stop them.
  bool failed = false;
  for (size_t done = 0; done < pids.size();) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) break;
    if (std::find(pids.begin(), pids.end(), pid) == pids.end()) continue;
    ++done;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (!failed)
        for (pid_t other : pids)
          if (other != pid) ::kill(other, SIGTERM);
      failed = true;
    }
  }
  launch.results.resize(local);
  for (int local_rank = 0; local_rank < local; ++local_rank) {
    std::ifstream in(result_path(local_rank), std::ios::binary);
    if (!in.good()) failed = true;
    else launch.results[local_rank].assign(std::istreambuf_iterator<char>(in), {});
    ::unlink(result_path(local_rank).c_str());
  }
  ::rmdir(dir.c_str());
  FSDP_CHECK(!failed, "one or more GPU ranks failed (their errors are above)");
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
