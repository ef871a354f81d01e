// Forking a node's ranks and hosting the store for them (Note [Launching on GPUs]).
#include "launch/node_ranks.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>

#include "fsdp/error.h"
#include "launch/rank_processes.h"
#include "launch/store_security.h"
#include "rendezvous/failure_notice.h"
#include "rendezvous/tcp_store.h"

namespace fsdp::launch {

namespace {

const char* const kNodeRanksReapedKey = "fsdp/node_ranks_reaped";

// Node 0's launcher hosts the store, and its ranks may finish before another node's are done
// with the store: it keeps the store up until every node has counted its reaped ranks there
// (or the timeout). A node whose store is gone (node 0 ended) has nobody to count for.
void keep_store_until_all_nodes_reaped(const LaunchEnv& node, bool hosts, const std::string& host,
                                       int port, rendezvous::Millis timeout,
                                       const std::string& secret) {
  if (node.nnodes == 1) return;
  try {
    rendezvous::TcpStore store({host, port, std::min(timeout, rendezvous::Millis(5000)), secret});
    store.add(kNodeRanksReapedKey, node.local_world_size);
    if (!hosts) return;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (store.add(kNodeRanksReapedKey, 0) < node.world_size &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const std::exception&) {
  }
}

}  // namespace

std::vector<std::string> run_node_ranks(const LaunchEnv& node, rendezvous::Millis timeout,
                                        const RankMain& rank_main) {
  FSDP_CHECK(node.launcher == Launcher::Fsdp, "run_node_ranks forks the ranks of fsdp's own "
             "launch, not of ", launcher_name(node.launcher));
  const int local = node.local_world_size;
  // Node 0's launcher hosts the store: it listens now, so the port is known to the children,
  // but serves only once they are all forked, so no child inherits an accepted connection;
  // each child closes its copy of the listening socket. The store then lives exactly as long
  // as this process, which outlives its ranks: a rank that dies cannot take it along.
  // Note [Store access]: it listens on loopback unless the nodes are several hosts, and
  // admits only clients that know the job's secret (made here for one node).
  const std::string secret = job_store_secret(node);
  std::unique_ptr<rendezvous::TcpStoreServer> server;
  int port = node.master_port;
  if (node.hosts_store()) {
    server = bind_job_store(node, node.master_port, secret);
    port = server->port();
  }
  const std::string store_host = server ? server->connect_host() : node.master_addr;
  // SIGTERM, SIGINT, SIGHUP or SIGQUIT from now on ends the ranks and removes their files
  // (StopSignals).
  StopSignals stop_signals;
  // Each child writes its result (which can be large) to a file here.
  const std::string dir = make_results_dir("fsdp-ranks-");
  auto result_path = [&](int local_rank) {
    return dir + "/rank" + std::to_string(local_rank) + ".out";
  };
  auto error_path = [&](int local_rank) { return result_path(local_rank) + ".error"; };
  std::vector<pid_t> pids;
  std::fflush(stdout);
  std::fflush(stderr);
  for (int local_rank = 0; local_rank < local; ++local_rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t other : pids) ::kill(other, SIGTERM);
      for (pid_t other : pids) ::waitpid(other, nullptr, 0);
      FSDP_FAIL("fork failed: ", std::strerror(errno));
    }
    if (pid == 0) {
      int code = 0;
      StopSignals::reset_in_child();
      try {
        if (server) server->close_in_child();
        const LaunchEnv e = for_local_rank(node, local_rank);
        this_thread_identity() = {e.rank, "process " + std::to_string(::getpid())};
        rendezvous::TcpStore store({store_host, port, timeout, secret});
        const std::string result = rank_main(e, store);
        std::ofstream out(result_path(local_rank), std::ios::binary);
        out << result;
        out.close();
        FSDP_CHECK(out.good(), "cannot write the rank's result to ", result_path(local_rank));
      } catch (const std::exception& e) {
        // Its launcher prints it (once, naming the rank), unless the file cannot be written.
        if (!write_rank_error(error_path(local_rank), e.what()))
          std::fprintf(stderr, "fsdp: error: %s\n", e.what());
        code = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(code);  // a child must not run the parent's atexit handlers
    }
    pids.push_back(pid);
  }
  if (server) server->start();
  // Names the first rank to fail, stops and reaps the others (rank_processes.h).
  const std::string first_failure = wait_for_rank_processes(
      pids, node.rank, /*grace_s=*/10, {}, {},
      [&](int rank) { return read_rank_error(error_path(rank - node.rank)); });
  if (!StopSignals::received())
    keep_store_until_all_nodes_reaped(node, server != nullptr, store_host, port, timeout, secret);
  bool failed = !first_failure.empty();
  std::vector<std::string> results(local);
  for (int local_rank = 0; local_rank < local; ++local_rank) {
    // Ranks that failed after the first (stopped, or failing on their own): their lines here.
    const std::string error = read_rank_error(error_path(local_rank));
    if (!error.empty() && first_failure.find(error) == std::string::npos)
      std::fprintf(stderr, "fsdp: error: rank %d: %s\n", node.rank + local_rank, error.c_str());
    std::ifstream in(result_path(local_rank), std::ios::binary);
    if (!in.good()) failed = true;
    else results[local_rank].assign(std::istreambuf_iterator<char>(in), {});
    ::unlink(result_path(local_rank).c_str());
    ::unlink(error_path(local_rank).c_str());
  }
  ::rmdir(dir.c_str());
  stop_signals.end_if_received();  // every rank is reaped and its file gone: go as told
  if (!first_failure.empty())
    FSDP_USER_FAIL(first_failure, "; the other ranks were stopped (their errors, if any, are above)");
  FSDP_CHECK(!failed, "a rank left no result");
  return results;
}

rendezvous::HostedStore open_rank_store(const LaunchEnv& e, rendezvous::Millis timeout) {
  FSDP_CHECK(e.launcher != Launcher::Fsdp, "open_rank_store is for a rank of an external launcher");
  rendezvous::HostedStore hosted = rendezvous::host_or_join_tcp_store(
      e.hosts_store(), e.master_addr, e.master_port, timeout, job_store_secret(e),
      e.hosts_store() ? store_bind_address(e) : "");
  if (e.agent_store) {
    try {
      hosted.store->add("fsdp/" + e.run_id + "/joined", 1);
    } catch (const Error& err) {
      FSDP_USER_FAIL("torchrun's agent store at ", hosted.store->address(), " (MASTER_ADDR:MASTER_PORT, "
                "TORCHELASTIC_USE_AGENT_STORE=True) did not answer: is this a PyTorch whose "
                "TCPStore protocol differs from Note [TCP store protocol]? ", err.what());
    }
  }
  return hosted;
}

std::string run_key_prefix(const LaunchEnv& e, const char* backend) {
  return "fsdp" + (e.run_id.empty() ? "" : "/" + e.run_id) + "/" + backend;
}

void arm_failure_notice(const LaunchEnv& e, const rendezvous::HostedStore& hosted,
                        const char* backend) {
  if (e.agent_store || hosted.server) return;  // not our server; or this process is the store
  rendezvous::post_failure_on_disconnect(
      *hosted.store, run_key_prefix(e, backend) + "/",
      {e.rank, detail::concat("rank ", e.rank, ", started by ", launcher_name(e.launcher),
                              ", ended without finishing: its connection to the store closed "
                              "(killed by a signal, or crashed)")});
}

}  // namespace fsdp::launch
