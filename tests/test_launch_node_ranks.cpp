// A node's ranks as forked processes meeting at the store that node 0's launcher hosts (what
// --nproc and --nnodes do on every back-end): on one node, on two "nodes" of this machine,
// and with a rank that fails or never arrives.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <map>
#include <thread>

#include "fsdp/error.h"
#include "launch/node_ranks.h"
#include "rendezvous/failure_notice.h"

namespace fsdp::launch {
namespace {

using rendezvous::Millis;
using rendezvous::Store;
const Millis kLong(60000);  // waits that must succeed: far longer than they ever take

// The job's secret, for forms whose ranks share no launcher's memory (Note [Store access]).
const char* const kJobSecret = "the node-rank tests' secret";

LaunchEnv node_of(const LaunchFlags& flags) {
  return resolve_launch(flags, [](const char* name) -> const char* {
    return std::string(name) == "FSDP_STORE_SECRET" ? kJobSecret : nullptr;
  });
}

// Every rank publishes its place, waits for all, and returns what it saw of the others.
std::string exchange(const LaunchEnv& e, Store& store) {
  store.set("place/" + std::to_string(e.rank),
            std::to_string(e.node_rank) + "." + std::to_string(e.local_rank));
  store.add("arrived", 1);
  store.barrier("all", e.rank, e.world_size, kLong);
  std::string seen = std::to_string(e.rank) + "/" + std::to_string(e.world_size) + ":";
  for (int r = 0; r < e.world_size; ++r) seen += store.get("place/" + std::to_string(r), kLong) + " ";
  return seen + store.get("arrived", kLong);
}

TEST(NodeRanks, ForkedRanksMeetAtTheStoreTheirLauncherHosts) {
  LaunchFlags f;
  f.nproc = 3;
  const std::vector<std::string> results = run_node_ranks(node_of(f), kLong, exchange);
  EXPECT_EQ(results, (std::vector<std::string>{"0/3:0.0 0.1 0.2 3", "1/3:0.0 0.1 0.2 3",
                                               "2/3:0.0 0.1 0.2 3"}));
}

// A port that was free a moment ago (the kernel's pick for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(NodeRanks, TwoNodesMeetAtNodeZerosStore) {
  LaunchFlags f;
  f.nproc = 2;
  f.nnodes = 2;
  f.master_addr = "127.0.0.1";
  f.master_port = free_port();
  f.node_rank = 1;
  const LaunchEnv node1 = node_of(f);
  std::fflush(stdout);
  const pid_t other_node = ::fork();
  if (other_node == 0) {
    int code = 1;
    try {
      const std::vector<std::string> r = run_node_ranks(node1, kLong, exchange);
      code = r == std::vector<std::string>{"2/4:0.0 0.1 1.0 1.1 4", "3/4:0.0 0.1 1.0 1.1 4"} ? 0 : 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "node 1: %s\n", e.what());
    }
    std::_Exit(code);
  }
  f.node_rank = 0;
  const std::vector<std::string> results = run_node_ranks(node_of(f), kLong, exchange);
  int status = 0;
  ASSERT_EQ(::waitpid(other_node, &status, 0), other_node);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(results,
            (std::vector<std::string>{"0/4:0.0 0.1 1.0 1.1 4", "1/4:0.0 0.1 1.0 1.1 4"}));
}

TEST(NodeRanks, ARankThatNeverArrivesIsNamedByTheOthers) {
  LaunchFlags f;
  f.nproc = 3;
  const std::vector<std::string> results =
      run_node_ranks(node_of(f), kLong, [](const LaunchEnv& e, Store& store) -> std::string {
        if (e.rank == 2) return "stayed away";
        try {
          store.barrier("start", e.rank, e.world_size, Millis(100));
        } catch (const Error& err) {
          return err.what();
        }
        return "(no timeout)";
      });
  ASSERT_EQ(results.size(), 3u);
  for (int r : {0, 1})
    EXPECT_NE(results[r].find("rendezvous 'start' timed out after 0.1 s: rank 2 of 3 never arrived"),
              std::string::npos)
        << results[r];
}

// The launch's error is the failing rank's own line (what the JSON summary records too), not
// only its exit status.
TEST(NodeRanks, AFailingRankStopsTheOthersAndTheLaunchFailsWithItsError) {
  LaunchFlags f;
  f.nproc = 3;
  std::string error;
  ::testing::internal::CaptureStderr();
  try {
    run_node_ranks(node_of(f), kLong, [](const LaunchEnv& e, Store& store) -> std::string {
      if (e.rank == 1) FSDP_USER_FAIL("out of memory on cuda:1: 2.0 GiB did not fit\nsecond line");
      store.barrier("start", e.rank, e.world_size, kLong);  // never completes: it is stopped
      return "finished";
    });
  } catch (const Error& e) {
    error = e.what();
  }
  const std::string printed = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(error.find("rank 1: out of memory on cuda:1: 2.0 GiB did not fit second line; the "
                       "other ranks were stopped"),
            std::string::npos) << error;
  // The launch's error is the one line the user sees: the rank does not print it again.
  EXPECT_EQ(printed.find("did not fit"), std::string::npos) << printed;
}

// A rank killed mid-run is named as killed, and the launch ends instead of waiting for it.
TEST(NodeRanks, AKilledRankIsNamedAndTheOthersAreStopped) {
  LaunchFlags f;
  f.nproc = 3;
  std::string error;
  try {
    run_node_ranks(node_of(f), kLong, [](const LaunchEnv& e, Store& store) -> std::string {
      if (e.rank == 2) ::raise(SIGKILL);
      store.barrier("start", e.rank, e.world_size, kLong);  // never completes: it is stopped
      return "finished";
    });
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("rank 2 was killed by signal 9 (Killed); the other ranks were stopped"),
            std::string::npos) << error;
}

LaunchEnv torchrun_rank(int rank, int port, bool agent_store, int world = 2) {
  const std::map<std::string, std::string> vars = {
      {"RANK", std::to_string(rank)}, {"WORLD_SIZE", std::to_string(world)}, {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", std::to_string(port)},
      {"TORCHELASTIC_USE_AGENT_STORE", agent_store ? "True" : "False"},
      {"FSDP_STORE_SECRET", kJobSecret}};
  return resolve_launch({}, [&](const char* n) -> const char* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(RankStore, RankZeroHostsOnMasterPortAndTheOthersJoin) {
  const int port = free_port();
  rendezvous::HostedStore r0 = open_rank_store(torchrun_rank(0, port, false), kLong);
  ASSERT_TRUE(r0.server);
  EXPECT_EQ(r0.server->port(), port);
  rendezvous::HostedStore r1 = open_rank_store(torchrun_rank(1, port, false), kLong);
  EXPECT_FALSE(r1.server);
  r0.store->set("id", "abc");
  EXPECT_EQ(r1.store->get("id", kLong), "abc");
}

// Note [Failure notices]: under an external launcher nobody of ours reaps a rank. Rank `rank`
// is forked, joins rank 0's store, arms its notice and dies by SIGKILL; the parent reaps it.
void fork_rank_that_dies(int rank, int port, int world) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      LaunchEnv e = torchrun_rank(rank, port, false, world);
      rendezvous::HostedStore h = open_rank_store(e, kLong);
      arm_failure_notice(e, h, "job");
      h.store->add("armed", 1);  // a round trip: the server holds the notice
      ::raise(SIGKILL);
    } catch (...) {
    }
    std::_Exit(3);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status));
}

TEST(RankStore, TheServerPostsTheNoticeOfARankThatDiedWithoutGoodbye) {
  const int port = free_port();
  rendezvous::HostedStore r0 = open_rank_store(torchrun_rank(0, port, false), kLong);
  arm_failure_notice(torchrun_rank(0, port, false), r0, "job");  // the host: nothing to arm
  fork_rank_that_dies(1, port, 2);
  rendezvous::PrefixStore job("fsdp/job", r0.store);
  const auto notice = rendezvous::read_failure(job, kLong);
  ASSERT_TRUE(notice);
  EXPECT_EQ(notice->rank, 1);
  EXPECT_EQ(notice->message, "rank 1, started by torchrun, ended without finishing: its "
                             "connection to the store closed (killed by a signal, or crashed)");
}

// A rank that destroys its store client (a normal end, or an error already reported) says
// goodbye, so nothing is posted for it: the one notice is that of the rank that died after.
TEST(RankStore, ARankThatSaysGoodbyePostsNothing) {
  const int port = free_port();
  rendezvous::HostedStore r0 = open_rank_store(torchrun_rank(0, port, false, 3), kLong);
  {
    rendezvous::HostedStore r1 = open_rank_store(torchrun_rank(1, port, false, 3), kLong);
    arm_failure_notice(torchrun_rank(1, port, false, 3), r1, "job");
    r1.store->add("armed", 1);
  }
  fork_rank_that_dies(2, port, 3);
  rendezvous::PrefixStore job("fsdp/job", r0.store);
  const auto notice = rendezvous::read_failure(job, kLong);
  ASSERT_TRUE(notice);
  EXPECT_EQ(notice->rank, 2);
  EXPECT_EQ(job.add("fsdp/failure/count", 0), 1);
}

TEST(RankStore, WithTorchrunsAgentStoreEveryRankJoinsIt) {
  rendezvous::TcpStoreServerOptions open;  // plays torchrun's agent, which takes no secret
  open.open = true;
  rendezvous::TcpStoreServer agent(open);
  rendezvous::HostedStore r0 = open_rank_store(torchrun_rank(0, agent.port(), true), kLong);
  rendezvous::HostedStore r1 = open_rank_store(torchrun_rank(1, agent.port(), true), kLong);
  EXPECT_FALSE(r0.server);
  EXPECT_FALSE(r1.server);
  EXPECT_EQ(r0.store->add("fsdp//joined", 0), 2);  // both made their round trip
}

TEST(RankStore, AnAgentStoreThatDoesNotAnswerIsNamed) {
  // A server that accepts and hangs up at once, as one would on a request it cannot read.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread hang_up([&] { ::close(::accept(listener, nullptr, nullptr)); });
  std::string error;
  try {
    open_rank_store(torchrun_rank(1, ntohs(a.sin_port), true), kLong);
  } catch (const Error& e) {
    error = e.what();
  }
  hang_up.join();
  ::close(listener);
  EXPECT_NE(error.find("torchrun's agent store at 127.0.0.1:" + std::to_string(ntohs(a.sin_port)) +
                       " (MASTER_ADDR:MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE=True) did not answer"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace fsdp::launch
