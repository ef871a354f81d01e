// Note [CPU ranks as processes]
// `run_cpu_processes` forks one process per rank on this host; with several hosts, one
// launcher per host starts its share of the ranks (node_rank * nproc ...). Each rank builds
// its own CPU device (checked mode and chaos delays as with threads) and a Gloo world
// communicator (Note [Gloo collectives]); the ranks meet at the job's store.
//
//  - Reaping. The launcher waits for its children. When one fails (its body threw) or dies
//    (a signal), the launcher records the failure in the store (Note [Failure notices]) if no
//    rank recorded one first, stops its other children, and throws an fsdp::Error carrying
//    the job's first failure: "rank 2 was killed by signal 9 (Killed)". Ranks on other hosts
//    see their collectives break (or time out), read the same notice and fail naming rank 2,
//    and their launcher reports it too. Children die with their launcher (PR_SET_PDEATHSIG).
//  - Ending. A rank that finished waits at a store barrier before it closes its connections,
//    so no peer still reading from it sees them close; a rank that failed exits at once,
//    without tearing down its device (a stream may be blocked in a Gloo wait), and the
//    kernel closes its sockets.
//  - Results. Each child writes its body's result into a file that its launcher reads back.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include "backend/gloo/gloo_backend.h"
#include "fsdp/error.h"
#include "launch/cpu_ranks.h"
#include "launch/node_ranks.h"
#include "launch/rank_processes.h"
#include "launch/store_security.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/failure_notice.h"

namespace fsdp {

namespace launch {

namespace {

using rendezvous::Millis;

// The address of this host that a connection to `peer_host` would leave from: where this
// host's ranks listen, so that ranks on `peer_host` can reach them.
std::string local_address_towards(const std::string& peer_host) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  FSDP_USER_CHECK(::getaddrinfo(peer_host.c_str(), "9", &hints, &found) == 0 && found,
                  "cannot resolve the master address '", peer_host, "'");
  // A datagram socket's connect() sends nothing; it only picks the route and source address.
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool ok = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  FSDP_USER_CHECK(ok, "no route from this host to the master address '", peer_host, "'");
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return text;
}

// Each launcher counts its children here as it reaps them; node 0's launcher, which hosts
// the store, keeps it up until every rank of the job has been counted, so that no rank loses
// the store while it still reads a failure notice or waits at the final barrier.
const char* const kReapedKey = "fsdp/ranks_reaped";

struct ChildPlan {
  int rank = 0;
  int world = 1;
  cpu::CpuOptions options;
  std::string listen_address;
  std::string result_path;
};

// Runs one rank in this process and returns its body's result. On a failure it reports to
// stderr and the store, and exits the process at once: the device stays as it is, since one
// of its streams may be blocked in a Gloo wait (see the Note).
std::string run_rank(int rank, int world_size, const cpu::CpuOptions& options,
                     const std::string& listen_address, const std::string& store_host,
                     const std::function<std::shared_ptr<rendezvous::Store>()>& connect,
                     const RankBodyWithResult& body) {
  this_thread_identity() = {rank, "cpu:" + std::to_string(rank)};
  const Millis timeout(static_cast<int64_t>(options.collective_timeout_s * 1000));
  // Kept out of the try block, so that a failure does not destroy them.
  std::shared_ptr<rendezvous::Store> store;
  std::unique_ptr<cpu::CpuWorld> world;
  std::unique_ptr<Device> device;
  std::shared_ptr<Comm> comm;
  try {
    store = connect();
    world = std::make_unique<cpu::CpuWorld>(world_size, options);
    device = world->make_device(rank);
    gloo_backend::GlooWorldOptions gloo;
    gloo.rank = rank;
    gloo.size = world_size;
    gloo.listen_address = listen_address;
    gloo.timeout_s = options.collective_timeout_s;
    gloo.store_host = store_host;
    comm = gloo_backend::make_world_comm(*device, store, gloo);
    std::string result = body(rank, *device, comm);
    device->synchronize();
    store->barrier("fsdp/ranks_done", rank, world_size, timeout);
    comm.reset();
    device.reset();
    return result;
  } catch (const std::exception& e) {
    // Errors raised on a rank's threads name it already ("[rank 2 cpu:2] ..."); others not.
    const bool named = std::strncmp(e.what(), "[rank ", 6) == 0;
    std::fprintf(stderr, "fsdp: error: %s%s\n",
                 named ? "" : ("rank " + std::to_string(rank) + ": ").c_str(), e.what());
    std::fflush(stderr);
    if (store)
      rendezvous::post_failure(*store, {rank, detail::concat("rank ", rank, " failed: ", e.what())});
    std::fflush(stdout);
    std::_Exit(1);
  }
}

[[noreturn]] void run_child(const ChildPlan& plan, pid_t launcher,
                            rendezvous::TcpStoreServer* server,
                            const rendezvous::TcpStoreOptions& store_at,
                            const RankBodyWithResult& body) {
  StopSignals::reset_in_child();
  if (server) server->close_in_child();  // only the launcher serves the store
  // A child must not outlive its launcher (a killed launcher would leave ranks behind).
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) std::_Exit(1);
  const std::string result = run_rank(
      plan.rank, plan.world, plan.options, plan.listen_address, "the launcher of node 0",
      [&] { return std::make_shared<rendezvous::TcpStore>(store_at); }, body);
  std::ofstream out(plan.result_path, std::ios::binary);
  out << result;
  out.close();
  if (!out.good()) {
    std::fprintf(stderr, "fsdp: error: rank %d: cannot write its result to %s\n", plan.rank,
                 plan.result_path.c_str());
    std::_Exit(1);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);  // a child must not run the parent's atexit handlers
}

// Under torchrun, srun or mpirun this process is one rank: it hosts the store (rank 0, unless
// torchrun's agent does) or joins it, and runs the body.
CpuProcessLaunch run_launched_rank(const LaunchEnv& e, const cpu::CpuOptions& options,
                                   const RankBodyWithResult& body) {
  const Millis timeout(static_cast<int64_t>(options.collective_timeout_s * 1000));
  rendezvous::HostedStore hosted = open_rank_store(e, timeout);
  auto store = std::make_shared<rendezvous::PrefixStore>(run_key_prefix(e, "cpu"), hosted.store);
  arm_failure_notice(e, hosted, "cpu");
  CpuProcessLaunch launch;
  launch.world_size = e.world_size;
  launch.first_rank = e.rank;
  launch.results.push_back(run_rank(e.rank, e.world_size, options,
                                    local_address_towards(e.master_addr),
                                    e.agent_store ? "torchrun's agent" : "rank 0",
                                    [&] { return store; }, body));
  // Every rank counts itself out; the host of the store keeps it up until all have.
  store->add(kReapedKey, 1);
  if (hosted.server) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (store->add(kReapedKey, 0) < e.world_size && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return launch;
}

// Waits for every child (rank_processes.h), counting each out in the store; the first
// failure is posted there for the other hosts, and the others are stopped.
std::optional<std::string> reap(const std::vector<pid_t>& pids, int first_rank,
                                rendezvous::Store& store) {
  const std::string failure = wait_for_rank_processes(
      pids, first_rank, /*grace_s=*/10,
      [&](int rank, const std::string& why) {
        try {
          rendezvous::post_failure(store, {rank, why});
        } catch (const std::exception&) {
          // node 0's store is gone: the failure is still this host's to report
        }
      },
      [&](int) {
        try {
          store.add(kReapedKey, 1);
        } catch (const std::exception&) {
          // node 0's store is gone: nobody is left to count for
        }
      });
  if (failure.empty()) return std::nullopt;
  return failure;
}

}  // namespace

CpuProcessLaunch run_cpu_process_world(int nproc, const cpu::CpuOptions& options,
                                       const CpuProcessOptions& where,
                                       const RankBodyWithResult& body) {
  FSDP_USER_CHECK(gloo_backend::built(),
                  "this build has no Gloo, which CPU ranks as processes need (install "
                  "libgloo-dev and configure again)");
  FSDP_USER_CHECK(options.collective_timeout_s > 0,
                  "ranks as processes need a timeout > 0 s, got ", options.collective_timeout_s);
  FSDP_USER_CHECK(!options.virtual_clock,
                  "the virtual clock needs every rank in one process (ranks as threads)");
  if (where.external) {
    const LaunchEnv e = resolve_launch(LaunchFlags{});
    FSDP_USER_CHECK(e.launcher != Launcher::Fsdp, "ranks as processes of an external launcher: "
                    "RANK and WORLD_SIZE (or srun's or mpirun's variables) are not set");
    return run_launched_rank(e, options, body);
  }
  FSDP_USER_CHECK(nproc >= 1, "the number of processes per host must be >= 1, got ", nproc);
  FSDP_USER_CHECK(where.nnodes >= 1 && where.node_rank >= 0 && where.node_rank < where.nnodes,
                  "node rank ", where.node_rank, " of ", where.nnodes, " hosts");
  FSDP_USER_CHECK(where.nnodes == 1 || (where.master_port > 0 && where.master_port < 65536),
                  "ranks on several hosts meet at --master-port, which must be given "
                  "(1..65535), got ", where.master_port);
  CpuProcessLaunch launch;
  launch.world_size = nproc * where.nnodes;
  launch.first_rank = where.node_rank * nproc;
  const rendezvous::Millis timeout(static_cast<int64_t>(options.collective_timeout_s * 1000));
  // The placement as a LaunchEnv, for Note [Store access] (with FSDP_STORE_SECRET and
  // FSDP_STORE_BIND from this process's environment).
  LaunchFlags flags;
  flags.nproc = nproc;
  flags.nnodes = where.nnodes;
  flags.node_rank = where.node_rank;
  flags.master_addr = where.master_addr;
  if (where.master_port > 0) flags.master_port = where.master_port;
  const LaunchEnv node = resolve_launch(flags);
  const std::string secret = job_store_secret(node);

  // SIGTERM, SIGINT, SIGHUP or SIGQUIT from now on ends the ranks and removes their files
  // (StopSignals).
  StopSignals stop_signals;
  const std::string dir = make_results_dir("fsdp-cpu-ranks-");
  struct RemoveOnExit {
    std::string path;
    ~RemoveOnExit() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  } results_dir{dir};
  // Node 0's launcher hosts the store: bound now (so the port is known), served after the
  // forks (so the children inherit no serving thread).
  std::unique_ptr<rendezvous::TcpStoreServer> server;
  if (where.node_rank == 0) server = bind_job_store(node, where.master_port, secret);
  rendezvous::TcpStoreOptions store_at;
  store_at.host = server ? server->connect_host() : where.master_addr;
  store_at.port = server ? server->port() : where.master_port;
  store_at.timeout = timeout;
  store_at.secret = secret;

  ChildPlan plan;
  plan.world = launch.world_size;
  plan.options = options;
  plan.listen_address =
      where.nnodes == 1 ? "127.0.0.1" : local_address_towards(where.master_addr);
  auto result_path = [&](int rank) { return dir + "/rank" + std::to_string(rank) + ".out"; };
  std::vector<pid_t> pids;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t launcher = ::getpid();
  for (int i = 0; i < nproc; ++i) {
    plan.rank = launch.first_rank + i;
    plan.result_path = result_path(plan.rank);
    const pid_t pid = ::fork();
    if (pid == 0) run_child(plan, launcher, server.get(), store_at, body);
    if (pid < 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      FSDP_FAIL("fork failed: ", std::strerror(errno));
    }
    pids.push_back(pid);
  }
  if (server) server->start();
  std::shared_ptr<rendezvous::Store> store;
  try {
    store = std::make_shared<rendezvous::TcpStore>(store_at);
  } catch (...) {
    for (pid_t p : pids) ::kill(p, SIGKILL);
    for (pid_t p : pids) ::waitpid(p, nullptr, 0);
    throw;
  }
  const std::optional<std::string> local_failure = reap(pids, launch.first_rank, *store);
  std::optional<rendezvous::FailureNotice> notice;
  if (local_failure && !StopSignals::received())
    notice = rendezvous::read_failure(*store, Millis(0));
  if (server) {
    // Every rank of the job reaped, or the timeout (or a stop signal): then the store may go.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    try {
      while (!StopSignals::received() && store->add(kReapedKey, 0) < launch.world_size &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } catch (const std::exception&) {
    }
  }
  if (StopSignals::received()) {  // every rank is reaped: clean up, then go as told
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
    stop_signals.end_if_received();
  }

  for (int i = 0; i < nproc; ++i) {
    const std::string path = result_path(launch.first_rank + i);
    if (!local_failure) {
      std::ifstream in(path, std::ios::binary);
      FSDP_CHECK(in.good(), "rank ", launch.first_rank + i, " finished without a result");
      launch.results.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  if (local_failure)
    throw Error(detail::concat("CPU ranks as processes failed: ",
                               notice ? notice->message : *local_failure));
  return launch;
}

}  // namespace launch

bool cpu_processes_built() { return gloo_backend::built(); }

CpuProcessLaunch run_cpu_processes_with_results(int nproc, const RankBodyWithResult& body,
                                                const CpuProcessOptions& options) {
  cpu::CpuOptions o;
  o.checked = options.cpu.checked;
  o.chaos = options.cpu.chaos;
  o.chaos_seed = options.cpu.chaos_seed;
  o.chaos_max_us = options.cpu.chaos_max_us;
  o.link_gbps = options.cpu.link_gbps;
  o.collective_timeout_s = options.timeout_s;
  return launch::run_cpu_process_world(nproc, o, options, body);
}

int run_cpu_processes(int nproc, const RankBody& body, const CpuProcessOptions& options) {
  return run_cpu_processes_with_results(
             nproc,
             [&](int rank, Device& device, std::shared_ptr<Comm> world) {
               body(rank, device, std::move(world));
               return std::string();
             },
             options)
      .world_size;
}

}  // namespace fsdp
