// Note [Store access]: where each launch form's store listens, where its secret comes from,
// and a launcher stopped by SIGTERM ending its ranks and removing their files. Every store
// here listens on 127.0.0.1; the other addresses below are only text, never bound or reached.
#include <gtest/gtest.h>

#include <dirent.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <map>

#include "fsdp/error.h"
#include "fsdp/launch.h"
#include "launch/node_ranks.h"
#include "launch/store_security.h"
#include "store_test_util.h"

namespace fsdp::launch {
namespace {

using rendezvous::Millis;
using rendezvous::Store;
using rendezvous::store_test::kLong;
using rendezvous::store_test::listening_addresses;

using Vars = std::map<std::string, std::string>;

EnvLookup lookup(const Vars& vars) {
  return [vars](const char* n) -> const char* {
    auto it = vars.find(n);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const char* const kJobSecret = "the store-access tests' secret";

// What a rank sees of its launcher (the parent): the listening sockets it holds.
std::string launcher_listens(const LaunchEnv&, Store& store) {
  std::string seen;
  for (const std::string& a : listening_addresses(::getppid())) seen += a + " ";
  return seen + "| store " + dynamic_cast<rendezvous::TcpStore&>(store).address();
}

TEST(StoreAccess, OneNodeListensOnLoopbackOnly) {
  LaunchFlags f;
  f.nproc = 2;
  const std::vector<std::string> seen = run_node_ranks(resolve_launch(f, lookup({})), kLong,
                                                       launcher_listens);
  ASSERT_EQ(seen.size(), 2u);
  const std::string store = seen[0].substr(seen[0].find("| store ") + 8);
  EXPECT_EQ(seen[0], store + " | store " + store);  // the store's socket alone, on 127.0.0.1
  EXPECT_EQ(store.rfind("127.0.0.1:", 0), 0u) << store;
  EXPECT_EQ(seen[1], seen[0]);
}

// --nnodes 2 with a loopback --master-addr: every "node" is this host, so is the store.
TEST(StoreAccess, NodesOnALoopbackMasterAddressListenOnLoopback) {
  const int port = [] {
    int p = 0;
    const int fd = rendezvous::store_test::listen_loopback(p);
    ::close(fd);
    return p;
  }();
  LaunchFlags f;
  f.nproc = 1;
  f.nnodes = 2;
  f.master_addr = "127.0.0.1";
  f.master_port = port;
  const Vars vars = {{"FSDP_STORE_SECRET", kJobSecret}};
  f.node_rank = 1;
  const LaunchEnv node1 = resolve_launch(f, lookup(vars));
  std::fflush(stdout);
  const pid_t other_node = ::fork();
  if (other_node == 0) {
    int code = 1;
    try {
      run_node_ranks(node1, kLong, [](const LaunchEnv&, Store& s) {
        s.barrier("met", 1, 2, kLong);
        return std::string();
      });
      code = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "node 1: %s\n", e.what());
    }
    std::_Exit(code);
  }
  f.node_rank = 0;
  const std::vector<std::string> seen =
      run_node_ranks(resolve_launch(f, lookup(vars)), kLong, [](const LaunchEnv& e, Store& s) {
        s.barrier("met", 0, 2, kLong);
        return launcher_listens(e, s);
      });
  int status = 0;
  ASSERT_EQ(::waitpid(other_node, &status, 0), other_node);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string at = "127.0.0.1:" + std::to_string(port);
  EXPECT_EQ(seen, std::vector<std::string>{at + " | store " + at});
}

TEST(StoreAccess, TheStoreListensWhereTheMasterAddressSays) {
  LaunchFlags one;
  one.nproc = 2;
  one.master_addr = "192.0.2.7";  // ranks all here: the address is not the store's business
  EXPECT_EQ(store_bind_address(resolve_launch(one, lookup({}))), "127.0.0.1");
  LaunchFlags two = one;
  two.nnodes = 2;
  two.node_rank = 0;
  two.master_port = 29500;
  const Vars secret = {{"FSDP_STORE_SECRET", kJobSecret}};
  EXPECT_EQ(store_bind_address(resolve_launch(two, lookup(secret))), "192.0.2.7");
  Vars torchrun = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"}, {"FSDP_STORE_SECRET", kJobSecret}};
  EXPECT_EQ(store_bind_address(resolve_launch({}, lookup(torchrun))), "127.0.0.1");
  torchrun["FSDP_STORE_BIND"] = "*";  // every interface: only when asked for
  EXPECT_EQ(store_bind_address(resolve_launch({}, lookup(torchrun))), "*");
  Vars bound = secret;
  bound["FSDP_STORE_BIND"] = "127.0.0.2";
  EXPECT_EQ(store_bind_address(resolve_launch(two, lookup(bound))), "127.0.0.2");
}

TEST(StoreAccess, ASecretIsMadeForOneNodeAndComesFromTheEnvironmentOtherwise) {
  LaunchFlags one;
  one.nproc = 2;
  const LaunchEnv node =
      resolve_launch(one, lookup({{"FSDP_STORE_SECRET", "not used here, ever"}}));
  const std::string a = job_store_secret(node), b = job_store_secret(node);
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_NE(a, "not used here, ever");

  LaunchFlags two = one;
  two.nnodes = 2;
  two.node_rank = 1;
  two.master_addr = "127.0.0.1";
  two.master_port = 29500;
  EXPECT_TRUE(contains(error_of([&] { job_store_secret(resolve_launch(two, lookup({}))); }),
                       "--nnodes 2: the launchers of every node meet at node 0's store, which "
                       "admits only those that know the job's secret: set FSDP_STORE_SECRET"));
  EXPECT_EQ(job_store_secret(resolve_launch(two, lookup({{"FSDP_STORE_SECRET", kJobSecret}}))),
            kJobSecret);

  const Vars srun = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                     {"MASTER_PORT", "29500"}};
  EXPECT_TRUE(contains(error_of([&] { job_store_secret(resolve_launch({}, lookup(srun))); }),
                       "started by srun, the ranks meet at rank 0's store, which admits only "
                       "those that know the job's secret: export FSDP_STORE_SECRET"));
  const std::string file = ::testing::TempDir() + "job_secret_" + std::to_string(::getpid());
  std::ofstream(file) << kJobSecret << "\n";
  Vars with_file = srun;
  with_file["FSDP_STORE_SECRET_FILE"] = file;
  EXPECT_EQ(job_store_secret(resolve_launch({}, lookup(with_file))), kJobSecret);
  with_file["FSDP_STORE_SECRET"] = kJobSecret;
  EXPECT_TRUE(contains(error_of([&] { resolve_launch({}, lookup(with_file)); }),
                       "FSDP_STORE_SECRET and FSDP_STORE_SECRET_FILE are both set"));
  Vars weak = srun;
  weak["FSDP_STORE_SECRET"] = "1234";
  EXPECT_TRUE(contains(error_of([&] { resolve_launch({}, lookup(weak)); }),
                       "FSDP_STORE_SECRET holds 4 bytes"));
  ::unlink(file.c_str());

  // torchrun's agent store takes no secret: none is asked for, nor read.
  const Vars agent = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                      {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                      {"FSDP_STORE_SECRET_FILE", "/no/such/file"}};
  EXPECT_EQ(job_store_secret(resolve_launch({}, lookup(agent))), "");
}

// Every entry of directory `dir` ("." and ".." aside).
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
        names.push_back(e->d_name);
    ::closedir(d);
  }
  return names;
}

// A launcher (a child here, with TMPDIR of its own) whose 2 ranks are running is sent `sig`
// (SIGTERM, or SIGHUP as when its terminal closes): it must end them, remove its results
// directory, and end by that signal itself. `launch(fd)` runs the launcher; each rank writes
// its pid to fd once it runs, then waits.
void expect_signal_to_clean_up(const std::string& name, const std::function<void(int)>& launch,
                               int sig = SIGTERM) {
  const std::string tmp = ::testing::TempDir() + name + "_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("rm -rf " + tmp + " && mkdir -p " + tmp).c_str()), 0);
  int started[2];
  ASSERT_EQ(::pipe(started), 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    ::close(started[0]);
    ::setenv("TMPDIR", tmp.c_str(), 1);
    ::signal(sig, SIG_DFL);  // as a terminal's process has it (not nohup's SIG_IGN)
    try {
      launch(started[1]);
    } catch (...) {
    }
    std::_Exit(0);
  }
  ::close(started[1]);
  std::vector<pid_t> ranks;
  for (int i = 0; i < 2; ++i) {
    pollfd p{started[0], POLLIN, 0};
    pid_t pid = 0;
    ASSERT_EQ(::poll(&p, 1, static_cast<int>(kLong.count())), 1);  // a bound on failure only
    ASSERT_EQ(::read(started[0], &pid, sizeof pid), static_cast<ssize_t>(sizeof pid));
    ranks.push_back(pid);
  }
  ::close(started[0]);
  EXPECT_EQ(entries(tmp).size(), 1u);  // the results directory, while the ranks run
  ASSERT_EQ(::kill(launcher, sig), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << status;
  EXPECT_EQ(entries(tmp), std::vector<std::string>{});
  for (pid_t rank : ranks) {
    const bool gone = ::kill(rank, 0) != 0 && errno == ESRCH;
    EXPECT_TRUE(gone) << "rank process " << rank << " outlived its launcher";
    if (!gone) ::kill(rank, SIGKILL);
  }
  ASSERT_EQ(std::system(("rm -rf " + tmp).c_str()), 0);
}

[[noreturn]] void report_and_wait(int fd) {
  const pid_t me = ::getpid();
  if (::write(fd, &me, sizeof me) != sizeof me) std::_Exit(5);
  for (;;) ::pause();
}

TEST(StoreAccess, SigtermEndsTheRanksAndRemovesTheirFiles) {
  expect_signal_to_clean_up("sigterm_node_ranks", [](int fd) {
    LaunchFlags f;
    f.nproc = 2;
    run_node_ranks(resolve_launch(f, lookup({})), kLong,
                   [fd](const LaunchEnv&, Store&) -> std::string { report_and_wait(fd); });
  });
}

// The same for CPU ranks as processes (their files: $TMPDIR/fsdp-cpu-ranks-*).
TEST(StoreAccess, SigtermEndsCpuRankProcessesAndRemovesTheirFiles) {
  if (!cpu_processes_built()) GTEST_SKIP() << "this build has no Gloo (libgloo-dev)";
  expect_signal_to_clean_up("sigterm_cpu_ranks", [](int fd) {
    CpuProcessOptions o;
    o.timeout_s = 30;
    run_cpu_processes(2, [fd](int, Device&, std::shared_ptr<Comm>) { report_and_wait(fd); }, o);
  });
}

// SIGHUP (the terminal of `fsdp train --nproc 2` closed) ends both launchers the same way.
TEST(StoreAccess, SighupEndsTheRanksAndRemovesTheirFiles) {
  expect_signal_to_clean_up(
      "sighup_node_ranks",
      [](int fd) {
        LaunchFlags f;
        f.nproc = 2;
        run_node_ranks(resolve_launch(f, lookup({})), kLong,
                       [fd](const LaunchEnv&, Store&) -> std::string { report_and_wait(fd); });
      },
      SIGHUP);
}

TEST(StoreAccess, SighupEndsCpuRankProcessesAndRemovesTheirFiles) {
  if (!cpu_processes_built()) GTEST_SKIP() << "this build has no Gloo (libgloo-dev)";
  expect_signal_to_clean_up(
      "sighup_cpu_ranks",
      [](int fd) {
        CpuProcessOptions o;
        o.timeout_s = 30;
        run_cpu_processes(2, [fd](int, Device&, std::shared_ptr<Comm>) { report_and_wait(fd); }, o);
      },
      SIGHUP);
}

// With every CPU rank on this host the launcher's store listens on loopback alone (each rank
// sees what its launcher, the test process here, listens on).
TEST(StoreAccess, CpuRankProcessesMeetAtAStoreOnLoopbackOnly) {
  if (!cpu_processes_built()) GTEST_SKIP() << "this build has no Gloo (libgloo-dev)";
  const CpuProcessLaunch launch =
      run_cpu_processes_with_results(2, [](int, Device&, std::shared_ptr<Comm>) {
        std::string seen;
        for (const std::string& a : listening_addresses(::getppid())) seen += a + " ";
        return seen;
      });
  ASSERT_EQ(launch.results.size(), 2u);
  EXPECT_EQ(launch.results[0].rfind("127.0.0.1:", 0), 0u) << launch.results[0];
  EXPECT_EQ(std::count(launch.results[0].begin(), launch.results[0].end(), ' '), 1)
      << launch.results[0];
  EXPECT_EQ(launch.results[1], launch.results[0]);
}

}  // namespace
}  // namespace fsdp::launch
