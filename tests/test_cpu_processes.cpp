// CPU ranks as processes (docs/cpu_processes.md): the Gloo communicator's values against the
// thread backend's and the host's arithmetic, and failures that end the job with the lost
// rank named instead of hanging. The timeouts here are bounds on failure, not timing
// assertions.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "command_util.h"
#include "cpu_test_util.h"
#include "fsdp/error.h"
#include "fsdp/launch.h"
#include "test_util.h"

namespace fsdp::testing {
namespace {

using cpu::cpu_test::download;
using cpu::cpu_test::Floats;
using cpu::cpu_test::round_to;
using cpu::cpu_test::upload;
using cpu::cpu_test::values;

#define SKIP_WITHOUT_GLOO() FSDP_SKIP_WITHOUT_PROCESSES(RanksAs::Processes)

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every collective of the Comm interface on both dtypes, with uneven sizes, in place and not,
// on two streams and a split communicator. Checks each result against the host's arithmetic
// (sums in member order in fp32, rounded once) and returns them all, as exact hex floats.
std::string every_collective(int rank, Device& d, std::shared_ptr<Comm> world) {
  const int n = world->size();
  const Stream s = d.create_stream("collectives", StreamPriority::Normal);
  const Stream s2 = d.create_stream("more collectives", StreamPriority::High);
  std::ostringstream out;
  out << std::hexfloat;
  auto record = [&](const char* what, const Floats& v) {
    out << what << ':';
    for (float x : v) out << ' ' << x;
    out << '\n';
  };
  auto member_sum = [&](int64_t count, int64_t first, int salt, DType t, bool avg) {
    Floats acc(static_cast<size_t>(count), 0.0f);
    for (int m = 0; m < n; ++m) {
      const Floats v = values(first + count, 1.0f, salt + m);
      for (int64_t e = 0; e < count; ++e) acc[e] += round_to(t, v[first + e]);
    }
    for (float& x : acc) x = round_to(t, avg ? x / static_cast<float>(n) : x);
    return acc;
  };
  std::vector<void*> owned;
  auto put = [&](Stream st, const Floats& v, DType t) { return owned.emplace_back(upload(d, st, v, t)); };
  for (DType t : {DType::F32, DType::BF16}) {
    const int64_t count = 7;  // over 4 members an all-reduce's chunks are 2, 2, 2, 1
    const size_t elem = dtype_size(t);
    // all_gather, out of place and in place.
    void* send = put(s, values(count, 1.0f, rank), t);
    void* gathered = owned.emplace_back(d.alloc(n * count * elem, s, MemTag::Other));
    world->all_gather(send, gathered, count, t, s);
    const Floats g = download(d, s, gathered, n * count, t);
    for (int m = 0; m < n; ++m)
      for (int64_t e = 0; e < count; ++e)
        FSDP_CHECK(g[m * count + e] == round_to(t, values(count, 1.0f, m)[e]), "all_gather");
    record("all_gather", g);
    void* in_place = put(s, values(n * count, 1.0f, 50 + rank), t);
    world->all_gather(static_cast<char*>(in_place) + rank * count * elem, in_place, count, t, s);
    record("all_gather in place", download(d, s, in_place, n * count, t));
    // reduce_scatter and all_reduce, sum and mean; the all_reduce in place on a second stream.
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      const bool avg = op == ReduceOp::Avg;
      void* rs_in = put(s, values(n * count, 1.0f, 10 + rank), t);
      void* rs_out = owned.emplace_back(d.alloc(count * elem, s, MemTag::Other));
      world->reduce_scatter(rs_in, rs_out, count, t, op, s);
      const Floats rs = download(d, s, rs_out, count, t);
      FSDP_CHECK(rs == member_sum(count, rank * count, 10, t, avg), "reduce_scatter");
      record("reduce_scatter", rs);
      void* ar = put(s2, values(count, 1.0f, 20 + rank), t);
      world->all_reduce(ar, ar, count, t, op, s2);
      const Floats r = download(d, s2, ar, count, t);
      FSDP_CHECK(r == member_sum(count, 0, 20, t, avg), "all_reduce");
      record("all_reduce", r);
    }
    // broadcast from member 1.
    void* b = put(s, values(count, 1.0f, 30 + rank), t);
    world->broadcast(b, count, t, 1, s);
    const Floats bv = download(d, s, b, count, t);
    for (int64_t e = 0; e < count; ++e)
      FSDP_CHECK(bv[e] == round_to(t, values(count, 1.0f, 31)[e]), "broadcast");
    record("broadcast", bv);
  }
  // all_to_all with uneven and zero counts: member m sends (m + j) % 3 elements to member j.
  std::vector<int64_t> send_counts(n), recv_counts(n);
  int64_t sent = 0, received = 0;
  for (int j = 0; j < n; ++j) {
    send_counts[j] = (rank + j) % 3;
    recv_counts[j] = (j + rank) % 3;
    sent += send_counts[j];
    received += recv_counts[j];
  }
  Floats a2a_in(static_cast<size_t>(sent));
  for (int64_t i = 0; i < sent; ++i) a2a_in[i] = static_cast<float>(100 * rank + i);
  void* a2a_send = put(s, a2a_in, DType::F32);
  void* a2a_recv = owned.emplace_back(d.alloc(received * 4 + 4, s, MemTag::Other));
  world->all_to_all(a2a_send, send_counts, a2a_recv, recv_counts, DType::F32, s);
  record("all_to_all", download(d, s, a2a_recv, received, DType::F32));
  // split: even and odd ranks, in reverse rank order (key = -rank).
  std::unique_ptr<Comm> half = world->split(rank % 2, -rank, "half");
  FSDP_CHECK(half && half->size() == (n + 1 - rank % 2) / 2, "split size");
  void* mine = put(s, {static_cast<float>(rank)}, DType::F32);
  void* all = owned.emplace_back(d.alloc(half->size() * 4, s, MemTag::Other));
  half->all_gather(mine, all, 1, DType::F32, s);
  const Floats members = download(d, s, all, half->size(), DType::F32);
  for (int i = 0; i + 1 < half->size(); ++i) FSDP_CHECK(members[i] > members[i + 1], "split order");
  record("split", members);
  FSDP_CHECK(world->split(-1, 0, "none") == nullptr, "color -1");
  d.synchronize();
  for (void* p : owned) d.free(p, s);
  d.synchronize();
  return out.str();
}

TEST(CpuProcesses, EveryCollectiveGivesTheBitsOfRanksAsThreads) {
  SKIP_WITHOUT_GLOO();
  const int world = 4;
  std::vector<std::string> threads(world);
  runtime::run_cpu_ranks(world, {}, [&](int rank, Device& d, std::shared_ptr<Comm> comm) {
    threads[rank] = every_collective(rank, d, comm);
  });
  const CpuProcessLaunch launch = run_cpu_processes_with_results(world, every_collective);
  EXPECT_EQ(launch.world_size, world);
  ASSERT_EQ(launch.results.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) EXPECT_EQ(launch.results[r], threads[r]) << "rank " << r;
}

// A body that runs all-reduces until `steps`; `die` (on the rank that calls it) in between.
void all_reduces(Device& d, Comm& world, int steps, const std::function<void(int)>& between) {
  const Stream s = d.create_stream("steps", StreamPriority::Normal);
  void* buf = upload(d, s, values(1024, 1.0f, world.rank()), DType::F32);
  for (int step = 0; step < steps; ++step) {
    world.all_reduce(buf, buf, 1024, DType::F32, ReduceOp::Avg, s);
    d.synchronize_stream(s);
    between(step);
  }
  d.free(buf, s);
}

CpuProcessOptions short_timeout() {
  CpuProcessOptions o;
  o.timeout_s = 10;
  return o;
}

std::string launch_error(int nproc, const RankBody& body, const CpuProcessOptions& options) {
  try {
    run_cpu_processes(nproc, body, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CpuProcesses, ARankKilledMidStepIsNamedWithItsSignal) {
  SKIP_WITHOUT_GLOO();
  const std::string error = launch_error(
      4,
      [](int rank, Device& d, std::shared_ptr<Comm> world) {
        all_reduces(d, *world, 1000, [&](int step) {
          if (rank == 2 && step == 3) ::raise(SIGKILL);
        });
      },
      short_timeout());
  EXPECT_TRUE(contains(error, "rank 2 was killed by signal 9")) << error;
}

TEST(CpuProcesses, ABodyThatThrowsIsNamedWithItsMessage) {
  SKIP_WITHOUT_GLOO();
  const std::string error = launch_error(
      3,
      [](int rank, Device& d, std::shared_ptr<Comm> world) {
        all_reduces(d, *world, 1000, [&](int step) {
          if (rank == 1 && step == 2) FSDP_USER_FAIL("the data file of rank 1 is empty");
        });
      },
      short_timeout());
  EXPECT_TRUE(contains(error, "rank 1 failed: the data file of rank 1 is empty")) << error;
}

// Rank 1 hangs (alive, connections open) and never issues the all-reduce that rank 0 waits
// in: Gloo's timeout ends rank 0, and the launcher stops rank 1.
TEST(CpuProcesses, ACollectiveThatAPeerNeverJoinsTimesOut) {
  SKIP_WITHOUT_GLOO();
  CpuProcessOptions o;
  o.timeout_s = 2;
  const std::string error = launch_error(
      2,
      [](int rank, Device& d, std::shared_ptr<Comm> world) {
        if (rank == 1)
          for (;;) ::pause();
        all_reduces(d, *world, 1, [](int) {});
      },
      o);
  EXPECT_TRUE(contains(error, "rank 0 failed: all_reduce #0 on communicator 'world' failed: no "
                              "answer from a peer within the timeout of 2 s")) << error;
  EXPECT_TRUE(contains(error, "rank 1 has not reached it")) << error;
}

// Sets an environment variable for the scope of a test (and what it forks).
struct ScopedEnv {
  std::string name;
  ScopedEnv(const std::string& n, const std::string& value) : name(n) {
    ::setenv(n.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Two launchers on this host act as two nodes of 2 ranks each. Rank 3 (node 1) is killed;
// node 0's ranks find their collectives broken, and name rank 3 and its signal themselves.
TEST(CpuProcesses, RanksOnAnotherNodeNameTheLostRank) {
  SKIP_WITHOUT_GLOO();
  const std::string dir = ::testing::TempDir() + "lost_rank_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  CpuProcessOptions o = short_timeout();
  o.nnodes = 2;
  o.master_port = free_port();
  // The launchers of two nodes share no memory: they share the job's secret this way.
  const ScopedEnv secret("FSDP_STORE_SECRET", "the two nodes' secret");
  // Each rank writes its own error where the test can read it, then fails as it would.
  auto body = [dir](int rank, Device& d, std::shared_ptr<Comm> world) {
    try {
      all_reduces(d, *world, 1000, [&](int step) {
        if (rank == 3 && step == 3) ::raise(SIGKILL);
      });
    } catch (const Error& e) {
      std::ofstream(dir + "/rank" + std::to_string(rank)) << e.what();
      throw;
    }
  };
  std::fflush(stdout);
  const pid_t node1 = ::fork();
  if (node1 == 0) {
    o.node_rank = 1;
    int code = 0;
    try {
      run_cpu_processes(2, body, o);
    } catch (const Error&) {
      code = 1;
    }
    std::_Exit(code);
  }
  o.node_rank = 0;
  const std::string error = launch_error(2, body, o);
  int status = 0;
  ASSERT_EQ(::waitpid(node1, &status, 0), node1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_TRUE(contains(error, "rank 3 was killed by signal 9")) << error;
  // The first of node 0's ranks to fail names rank 3; its launcher may stop the other before
  // that one gets to write (then its file is missing), but no rank blames anyone else.
  int named = 0;
  for (int rank : {0, 1}) {
    std::ifstream in(dir + "/rank" + std::to_string(rank));
    const std::string own((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (own.empty()) continue;
    EXPECT_TRUE(contains(own, "lost rank 3 (rank 3 was killed by signal 9")) << rank << ": " << own;
    ++named;
  }
  EXPECT_GE(named, 1);
}

// Under srun (only its variables set) each process is one rank, and nobody of ours reaps
// them. Rank `victim` of two kills itself at step 3; returns what the other rank printed.
std::string srun_survivor_error(int victim) {
  // Names of this test's own: ctest runs tests in parallel processes.
  const std::string dir = ::testing::TempDir() + "srun_victim" + std::to_string(victim) + "_" +
                          std::to_string(::getpid()) + "_";
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const std::string log = dir + "srun_rank" + std::to_string(rank) + ".err";
      std::FILE* f = std::freopen(log.c_str(), "w", stderr);
      if (!f) std::_Exit(3);
      for (const char* v : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MASTER_ADDR"})
        ::unsetenv(v);
      ::setenv("SLURM_PROCID", std::to_string(rank).c_str(), 1);
      ::setenv("SLURM_LOCALID", std::to_string(rank).c_str(), 1);
      ::setenv("SLURM_NTASKS", "2", 1);
      ::setenv("SLURM_NNODES", "1", 1);
      ::setenv("SLURM_NODEID", "0", 1);
      ::setenv("SLURM_TASKS_PER_NODE", "2", 1);
      ::setenv("SLURM_STEP_NODELIST", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("FSDP_STORE_SECRET", "the srun tests' secret", 1);
      CpuProcessOptions o;
      o.external = true;
      o.timeout_s = 30;  // far longer than the test takes: the notice, not a timeout, ends it
      try {
        run_cpu_processes(1, [&](int r, Device& d, std::shared_ptr<Comm> world) {
          all_reduces(d, *world, 1000, [&](int step) {
            if (r == victim && step == 3) ::raise(SIGKILL);
          });
        }, o);
      } catch (...) {
      }
      std::_Exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  std::ifstream in(dir + "srun_rank" + std::to_string(1 - victim) + ".err");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(CpuProcesses, UnderSrunAKilledRankIsNamedFromTheNoticeItsConnectionLeft) {
  SKIP_WITHOUT_GLOO();
  const std::string error = srun_survivor_error(/*victim=*/1);
  EXPECT_TRUE(contains(error, "rank 0: all_reduce #")) << error;
  EXPECT_TRUE(contains(error, "lost rank 1 (rank 1, started by srun, ended without finishing: "
                              "its connection to the store closed (killed by a signal, or "
                              "crashed))")) << error;
}

TEST(CpuProcesses, UnderSrunALostStoreHostIsNamed) {
  SKIP_WITHOUT_GLOO();
  const std::string error = srun_survivor_error(/*victim=*/0);
  EXPECT_TRUE(contains(error, "rank 1: all_reduce #")) << error;
  EXPECT_TRUE(contains(error, "a peer's connection broke, and the store does not answer "
                              "either: rank 0, which hosts it, is lost")) << error;
}

TEST(CpuProcesses, BadPlacementsAreOneLineErrors) {
  SKIP_WITHOUT_GLOO();
  CpuProcessOptions o;
  o.nnodes = 2;
  o.node_rank = 2;
  EXPECT_TRUE(contains(launch_error(1, [](int, Device&, std::shared_ptr<Comm>) {}, o),
                       "node rank 2 of 2 hosts"));
  o.node_rank = 1;
  o.master_port = 0;
  EXPECT_TRUE(contains(launch_error(1, [](int, Device&, std::shared_ptr<Comm>) {}, o),
                       "--master-port, which must be given"));
  EXPECT_TRUE(contains(launch_error(0, [](int, Device&, std::shared_ptr<Comm>) {}, {}),
                       "must be >= 1, got 0"));
}

nlohmann::json train_summary(const std::string& ranks, const std::string& name) {
  const std::string json = ::testing::TempDir() + name + ".json";
  const CommandResult r = run_fsdp_command(
      "train --backend cpu " + ranks + " --model transformer --layers 2 --dim 32 --heads 4 "
      "--kv-heads 2 --ffn-dim 40 --seq-len 8 --vocab 61 --tokens 16 --steps 5 --quiet --json " +
      json);
  EXPECT_EQ(r.code, 0) << r.output;
  std::ifstream in(json);
  return nlohmann::json::parse(in);
}

TEST(CpuProcessesCli, NprocGivesTheLossesOfAsManyThreads) {
  SKIP_WITHOUT_GLOO();
  const nlohmann::json threads = train_summary("--world-size 4", "threads4");
  const nlohmann::json processes = train_summary("--nproc 4 --timeout 30", "processes4");
  EXPECT_EQ(processes["world_size"], 4);
  EXPECT_EQ(processes["losses"], threads["losses"]);
  EXPECT_EQ(processes["losses"].size(), 5u);
}

// An external launcher's form: two `fsdp train` processes, each one rank through the
// variables torchrun, srun or mpirun would set (docs/launch.md); rank 0 hosts the store on
// MASTER_PORT (srun: on the first host of its node list). The losses must be those of --nproc 2.
struct ExternalForm {
  const char* name;
  // The variables of rank r, and those every rank shares (given the port).
  std::string (*rank_vars)(int r);
  std::string (*shared_vars)(int port);
};

const ExternalForm kExternalForms[] = {
    {"torchrun",
     [](int r) { return "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r); },
     [](int port) {
       return "WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
              std::to_string(port);
     }},
    {"srun",
     [](int r) { return "SLURM_PROCID=" + std::to_string(r) + " SLURM_LOCALID=" + std::to_string(r); },
     [](int port) {
       return "SLURM_NTASKS=2 SLURM_NNODES=1 SLURM_NODEID=0 SLURM_TASKS_PER_NODE=2 "
              "SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_STEP_NODELIST=127.0.0.1 MASTER_PORT=" +
              std::to_string(port);
     }},
    {"mpirun_openmpi",
     [](int r) {
       return "OMPI_COMM_WORLD_RANK=" + std::to_string(r) +
              " OMPI_COMM_WORLD_LOCAL_RANK=" + std::to_string(r);
     },
     [](int port) {
       return "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_SIZE=2 MASTER_ADDR=127.0.0.1 "
              "MASTER_PORT=" + std::to_string(port);
     }},
    {"mpirun_mpich",
     [](int r) { return "PMI_RANK=" + std::to_string(r) + " MPI_LOCALRANKID=" + std::to_string(r); },
     [](int port) {
       return "PMI_SIZE=2 MPI_LOCALNRANKS=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
              std::to_string(port);
     }},
};

class ExternalLauncherCli : public ::testing::TestWithParam<ExternalForm> {};

TEST_P(ExternalLauncherCli, TwoProcessesGiveTheLossesOfNproc) {
  SKIP_WITHOUT_GLOO();
  const ExternalForm& form = GetParam();
  const std::string dir = ::testing::TempDir();
  const std::string name = form.name;
  const std::string args =
      " train --backend cpu --model transformer --layers 2 --dim 32 --heads 4 --kv-heads 2 "
      "--ffn-dim 40 --seq-len 8 --vocab 61 --tokens 16 --steps 5 --quiet --timeout 30";
  const std::string shared =
      form.shared_vars(free_port()) + " FSDP_STORE_SECRET=the_cli_forms_secret";
  auto rank_cmd = [&](int r) {
    // env -i: no variable of the launcher running this test (an sbatch job's SLURM_*) leaks in.
    return "env -i PATH=\"$PATH\" " + form.rank_vars(r) + " " + shared + " " + FSDP_BINARY +
           args + (r == 0 ? " --json " + name + ".json" : "") + " > " + name +
           std::to_string(r) + ".log 2>&1";
  };
  const std::string cmd = "cd " + dir + " && (" + rank_cmd(1) + " & " + rank_cmd(0) +
                          "; a=$?; wait $!; b=$?; exit $((a | b)))";
  std::ofstream(dir + name + ".sh") << cmd << "\n";
  ASSERT_EQ(std::system(("bash " + dir + name + ".sh").c_str()), 0)
      << std::ifstream(dir + name + "0.log").rdbuf() << std::ifstream(dir + name + "1.log").rdbuf();
  std::ifstream in(dir + name + ".json");
  const nlohmann::json external = nlohmann::json::parse(in);
  const nlohmann::json nproc = train_summary("--nproc 2", "nproc2_" + name);
  EXPECT_EQ(external["world_size"], 2);
  EXPECT_EQ(external["losses"].size(), 5u);
  EXPECT_EQ(external["losses"], nproc["losses"]);
}

INSTANTIATE_TEST_SUITE_P(Forms, ExternalLauncherCli, ::testing::ValuesIn(kExternalForms),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace fsdp::testing
