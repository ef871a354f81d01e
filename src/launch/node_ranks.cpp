// Forking a node's ranks and hosting the store for them (Note [Launching on GPUs]).
#include "launch/node_ranks.h"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "fsdp/error.h"
#include "rendezvous/tcp_store.h"

namespace fsdp::launch {

namespace {

// Reaps exactly `pids` (never another child of this process, e.g. a caller's); as soon as
// one fails, sends the others SIGTERM, since they could wait for it forever. Returns whether
// all exited with 0. Waits on pidfds, so the first failure is seen whichever child it is.
bool wait_for_children(const std::vector<pid_t>& pids) {
  std::vector<pollfd> fds;
  for (pid_t pid : pids) fds.push_back({static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)), POLLIN, 0});
  const bool have_pidfds = std::all_of(fds.begin(), fds.end(), [](const pollfd& p) { return p.fd >= 0; });
  bool all_ok = true;
  auto reap = [&](size_t i) {
    int status = 0;
    while (::waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {
    }
    if (fds[i].fd >= 0) ::close(fds[i].fd);
    fds[i].fd = -1;  // poll() ignores it from now on
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    if (all_ok)
      for (size_t j = 0; j < pids.size(); ++j)
        if (j != i) ::kill(pids[j], SIGTERM);
    all_ok = false;
  };
  if (!have_pidfds) {  // a kernel before 5.3: in order, so a failure is seen late
    for (size_t i = 0; i < pids.size(); ++i) reap(i);
    return all_ok;
  }
  for (size_t left = pids.size(); left > 0;) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      FSDP_FAIL("waiting for the ranks failed: ", std::strerror(errno));
    }
    for (size_t i = 0; i < fds.size(); ++i)
      if (fds[i].fd >= 0 && fds[i].revents) {
        reap(i);
        --left;
      }
  }
  return all_ok;
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
  std::unique_ptr<rendezvous::TcpStoreServer> server;
  int port = node.master_port;
  if (node.hosts_store()) {
    server = std::make_unique<rendezvous::TcpStoreServer>(node.master_port, /*start=*/false);
    port = server->port();
  }
  const std::string store_host = server ? "127.0.0.1" : node.master_addr;
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
    const pid_t pid = ::fork();
    if (pid < 0) {
      for (pid_t other : pids) ::kill(other, SIGTERM);
      for (pid_t other : pids) ::waitpid(other, nullptr, 0);
      FSDP_FAIL("fork failed: ", std::strerror(errno));
    }
    if (pid == 0) {
      int code = 0;
      try {
        if (server) server->close_in_child();
        const LaunchEnv e = for_local_rank(node, local_rank);
        this_thread_identity() = {e.rank, "process " + std::to_string(::getpid())};
        rendezvous::TcpStore store({store_host, port, timeout});
        const std::string result = rank_main(e, store);
        std::ofstream out(result_path(local_rank), std::ios::binary);
        out << result;
        out.close();
        FSDP_CHECK(out.good(), "cannot write the rank's result to ", result_path(local_rank));
      } catch (const std::exception& e) {
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
  bool failed = !wait_for_children(pids);
  std::vector<std::string> results(local);
  for (int local_rank = 0; local_rank < local; ++local_rank) {
    std::ifstream in(result_path(local_rank), std::ios::binary);
    if (!in.good()) failed = true;
    else results[local_rank].assign(std::istreambuf_iterator<char>(in), {});
    ::unlink(result_path(local_rank).c_str());
  }
  ::rmdir(dir.c_str());
  FSDP_CHECK(!failed, "one or more ranks failed (their errors are above)");
  return results;
}

rendezvous::HostedStore open_rank_store(const LaunchEnv& e, rendezvous::Millis timeout) {
  FSDP_CHECK(e.launcher != Launcher::Fsdp, "open_rank_store is for a rank of an external launcher");
  rendezvous::HostedStore hosted =
      rendezvous::host_or_join_tcp_store(e.hosts_store(), e.master_addr, e.master_port, timeout);
  if (e.agent_store) {
    try {
      hosted.store->add("fsdp/" + e.run_id + "/joined", 1);
    } catch (const Error& err) {
      FSDP_FAIL("torchrun's agent store at ", hosted.store->address(), " (MASTER_ADDR:MASTER_PORT, "
                "TORCHELASTIC_USE_AGENT_STORE=True) did not answer: is this a PyTorch whose "
                "TCPStore protocol differs from Note [TCP store protocol]? ", err.what());
    }
  }
  return hosted;
}

}  // namespace fsdp::launch
