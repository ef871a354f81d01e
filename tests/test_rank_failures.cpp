// A lost rank is named: the --nproc parent names the child that died and stops and reaps the
// rest (src/launch/rank_processes.h); on CPU rank threads, the rank that threw is named in
// the errors of the ranks it stopped.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/error.h"
#include "fsdp/launch.h"
#include "launch/rank_processes.h"

namespace fsdp::testing {
namespace {

enum class Child { Clean, WaitsForever, IgnoresSigterm, KillsItself, ExitsWith3 };

// Only async-signal-safe calls in the child (the test process has threads).
pid_t spawn(Child what) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  switch (what) {
    case Child::Clean: ::_exit(0);
    case Child::WaitsForever: break;
    case Child::IgnoresSigterm: ::signal(SIGTERM, SIG_IGN); break;
    case Child::KillsItself: ::raise(SIGKILL); break;
    case Child::ExitsWith3: ::_exit(3);
  }
  for (;;) ::pause();
}

bool all_reaped(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) != -1 || errno != ECHILD) return false;
  }
  return true;
}

TEST(RankProcesses, AKilledRankIsNamedAndEveryOtherIsStoppedAndReaped) {
  const std::vector<pid_t> pids = {spawn(Child::WaitsForever), spawn(Child::KillsItself),
                                   spawn(Child::IgnoresSigterm)};
  // Rank 2 ignores SIGTERM, so it takes the SIGKILL after the grace period.
  std::vector<std::pair<int, std::string>> recorded;
  const std::string failure = launch::wait_for_rank_processes(
      pids, /*first_rank=*/0, /*grace_s=*/0.2,
      [&](int rank, const std::string& why) { recorded.push_back({rank, why}); });
  EXPECT_EQ(failure, "rank 1 was killed by signal 9 (Killed)");
  EXPECT_TRUE(all_reaped(pids));
  // Told once, about the first failure only (not about the ranks it stopped).
  ASSERT_EQ(recorded.size(), 1u);
  EXPECT_EQ(recorded[0].first, 1);
  EXPECT_EQ(recorded[0].second, failure);
}

TEST(RankProcesses, ANonZeroExitIsNamedByItsGlobalRank) {
  const std::vector<pid_t> pids = {spawn(Child::ExitsWith3), spawn(Child::WaitsForever)};
  // Ranks 4 and 5 of a job (a second node's).
  EXPECT_EQ(launch::wait_for_rank_processes(pids, 4, 0.2), "rank 4 exited with status 3");
  EXPECT_TRUE(all_reaped(pids));
}

TEST(RankProcesses, CleanExitsAreNoFailure) {
  const std::vector<pid_t> pids = {spawn(Child::Clean), spawn(Child::Clean), spawn(Child::Clean)};
  EXPECT_EQ(launch::wait_for_rank_processes(pids), "");
  EXPECT_TRUE(all_reaped(pids));
}

// A rank whose peer died writes to a closed socket: the write fails with EPIPE, which the rank
// reports naming the peer, instead of SIGPIPE ending the rank silently (a two-host run lost
// its second rank that way when the first was killed).
TEST(RankProcesses, AWriteToADeadPeerIsAnErrorNotSigpipe) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ::close(fds[1]);  // the peer is gone
  const pid_t pid = ::fork();
  if (pid == 0) {
    launch::StopSignals::reset_in_child();
    const char byte = 1;
    const ssize_t wrote = ::write(fds[0], &byte, 1);
    ::_exit(wrote == -1 && errno == EPIPE ? 0 : 2);
  }
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_FALSE(WIFSIGNALED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// Rank 1's body throws something that is not an fsdp::Error: the caller gets an fsdp::Error
// naming rank 1, and rank 0, stopped while it waited for rank 1 in a collective, says that
// rank 1 failed.
TEST(RankThreads, AThrowingRankIsNamedAsTheLostOne) {
  std::string rank0_error;
  try {
    run_cpu_ranks(2, [&](int rank, Device& device, std::shared_ptr<Comm> world) {
      if (rank == 1) throw std::runtime_error("disk on fire");
      const Stream s = device.create_stream("s", StreamPriority::Normal);
      float* x = static_cast<float*>(device.alloc(2 * sizeof(float), s, MemTag::Other));
      try {
        world->all_reduce(x, x + 1, 1, DType::F32, ReduceOp::Sum, s);
        device.synchronize_stream(s);
      } catch (const Error& e) {
        rank0_error = e.what();
        device.free(x, s);
        throw;
      }
    });
    FAIL() << "the launch returned normally";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[rank 1] failed: disk on fire"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(rank0_error.find("aborted: rank 1 failed: "), std::string::npos) << rank0_error;
}

}  // namespace
}  // namespace fsdp::testing
