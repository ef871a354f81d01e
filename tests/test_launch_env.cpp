// Where ranks come from: each launcher's environment (torchrun, srun, mpirun) and the command
// line read into one LaunchEnv, in the documented precedence, and one-line errors for
// inconsistent input (Note [Launch environments]).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "fsdp/error.h"
#include "launch/launch_env.h"

namespace fsdp::launch {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup lookup(const Vars& vars) {
  return [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

LaunchEnv resolve(const Vars& vars, const LaunchFlags& flags = {}) {
  return resolve_launch(flags, lookup(vars));
}

// The one-line message of a UserError, or "(no error)".
std::string user_error(const Vars& vars, const LaunchFlags& flags = {}) {
  try {
    resolve(vars, flags);
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  return "(no error)";
}

void expect_place(const LaunchEnv& e, int rank, int world, int local_rank, int local_world,
                  int node, int nnodes) {
  EXPECT_EQ(e.rank, rank);
  EXPECT_EQ(e.world_size, world);
  EXPECT_EQ(e.local_rank, local_rank);
  EXPECT_EQ(e.local_world_size, local_world);
  EXPECT_EQ(e.node_rank, node);
  EXPECT_EQ(e.nnodes, nnodes);
}

TEST(LaunchEnv, NothingSetIsOneNodeWithALocalStoreOnAFreePort) {
  LaunchFlags f;
  f.nproc = 4;
  const LaunchEnv e = resolve({}, f);
  EXPECT_EQ(e.launcher, Launcher::Fsdp);
  expect_place(e, 0, 4, 0, 4, 0, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 0);
  EXPECT_TRUE(e.hosts_store());
  const LaunchEnv r3 = for_local_rank(e, 3);
  expect_place(r3, 3, 4, 3, 4, 0, 1);
}

TEST(LaunchEnv, CommandLineMultiNode) {
  LaunchFlags f;
  f.nproc = 8;
  f.nnodes = 2;
  f.node_rank = 1;
  f.master_addr = "node0";
  f.master_port = 29400;
  const LaunchEnv e = resolve({}, f);
  EXPECT_EQ(e.launcher, Launcher::Fsdp);
  expect_place(e, 8, 16, 0, 8, 1, 2);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29400);
  EXPECT_FALSE(e.hosts_store());  // node 0's launcher hosts it
  expect_place(for_local_rank(e, 5), 13, 16, 5, 8, 1, 2);
  f.node_rank = 0;
  EXPECT_TRUE(resolve({}, f).hosts_store());
}

TEST(LaunchEnv, CommandLineTakesTheStoreAddressFromTheEnvironmentWhenNotGiven) {
  LaunchFlags f;
  f.nproc = 2;
  f.nnodes = 2;
  f.node_rank = 0;
  const LaunchEnv e = resolve({{"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "1234"}}, f);
  EXPECT_EQ(e.master_addr, "10.0.0.5");
  EXPECT_EQ(e.master_port, 1234);
}

TEST(LaunchEnv, Torchrun) {
  const Vars vars = {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                     {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}, {"MASTER_ADDR", "host0"},
                     {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                     {"TORCHELASTIC_RUN_ID", "job7"}, {"TORCHELASTIC_RESTART_COUNT", "2"}};
  const LaunchEnv e = resolve(vars);
  EXPECT_EQ(e.launcher, Launcher::Torchrun);
  expect_place(e, 5, 8, 1, 4, 1, 2);
  EXPECT_EQ(e.master_addr, "host0");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_TRUE(e.agent_store);
  EXPECT_EQ(e.run_id, "job7.2");
  EXPECT_EQ(e.describe(), "rank 5 of 8 (local rank 1 of 4 on node 1 of 2), started by torchrun");
}

TEST(LaunchEnv, TorchrunRankZeroHostsTheStoreOnlyWithoutTheAgentStore) {
  Vars vars = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
               {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
               {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  EXPECT_FALSE(resolve(vars).hosts_store());  // the agent already serves MASTER_PORT
  vars["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_TRUE(resolve(vars).hosts_store());
  vars.erase("TORCHELASTIC_USE_AGENT_STORE");
  const LaunchEnv e = resolve(vars);
  EXPECT_TRUE(e.hosts_store());
  expect_place(e, 0, 2, 0, 2, 0, 1);  // no LOCAL_WORLD_SIZE: one node
}

TEST(LaunchEnv, Srun) {
  const Vars vars = {{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                     {"SLURM_NNODES", "2"}, {"SLURM_NODEID", "1"},
                     {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_JOB_ID", "991"},
                     {"SLURM_STEP_ID", "0"},
                     {"SLURM_JOB_NODELIST", "gpu[07-08]"}, {"MASTER_PORT", "29500"}};
  const LaunchEnv e = resolve(vars);
  EXPECT_EQ(e.launcher, Launcher::Slurm);
  expect_place(e, 6, 8, 2, 4, 1, 2);
  EXPECT_EQ(e.master_addr, "gpu07");  // the first host of the node list
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.run_id, "991.0");
  EXPECT_FALSE(e.hosts_store());
}

TEST(LaunchEnv, SrunPrefersTheStepNodeListAndMasterAddr) {
  Vars vars = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a[1-9]"},
               {"SLURM_STEP_NODELIST", "b[003-004]"}, {"MASTER_PORT", "29500"}};
  EXPECT_EQ(resolve(vars).master_addr, "b003");
  vars["MASTER_ADDR"] = "10.1.2.3";
  EXPECT_EQ(resolve(vars).master_addr, "10.1.2.3");
  LaunchFlags f;
  f.master_addr = "cli-host";
  f.master_port = 4000;
  const LaunchEnv e = resolve(vars, f);  // the command line overrides the environment
  EXPECT_EQ(e.master_addr, "cli-host");
  EXPECT_EQ(e.master_port, 4000);
  EXPECT_EQ(e.launcher, Launcher::Slurm);
}

TEST(LaunchEnv, SrunWithoutAPortSaysHowToGiveOne) {
  const std::string e =
      user_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n1"}});
  EXPECT_NE(e.find("started by srun but MASTER_PORT is not set"), std::string::npos) << e;
}

TEST(LaunchEnv, OpenMpi) {
  const Vars vars = {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                     {"MASTER_ADDR", "h0"}, {"MASTER_PORT", "29600"}};
  const LaunchEnv e = resolve(vars);
  EXPECT_EQ(e.launcher, Launcher::Mpi);
  expect_place(e, 3, 4, 1, 2, 1, 2);
  EXPECT_EQ(e.master_addr, "h0");
  EXPECT_EQ(e.master_port, 29600);
}

TEST(LaunchEnv, MpichPmi) {
  const LaunchEnv e = resolve({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MASTER_ADDR", "h"},
                               {"MASTER_PORT", "5000"}});
  EXPECT_EQ(e.launcher, Launcher::Mpi);
  expect_place(e, 2, 3, 2, 3, 0, 1);
}

TEST(LaunchEnv, MpirunWithoutMasterAddrIsOneLine) {
  const std::string e = user_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_NE(e.find("started by mpirun but MASTER_ADDR is not set"), std::string::npos) << e;
  EXPECT_NE(e.find("mpirun -x MASTER_ADDR="), std::string::npos) << e;
}

TEST(LaunchEnv, PrecedenceTorchrunOverSrunOverMpirun) {
  Vars vars = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
               {"PMI_RANK", "0"}, {"PMI_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
  EXPECT_EQ(resolve(vars).launcher, Launcher::Torchrun);
  vars.erase("RANK");
  EXPECT_EQ(resolve(vars).launcher, Launcher::Slurm);
  vars.erase("SLURM_PROCID");
  EXPECT_EQ(resolve(vars).launcher, Launcher::Mpi);
  // --nproc in an sbatch script (SLURM_PROCID set there too): fsdp forks the ranks itself.
  vars["SLURM_PROCID"] = "0";
  LaunchFlags f;
  f.nproc = 2;
  EXPECT_EQ(resolve(vars, f).launcher, Launcher::Fsdp);
}

TEST(LaunchEnv, InconsistentInputIsOneLine) {
  const Vars torchrun = {{"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](Vars v, const std::string& k, const std::string& val) {
    v[k] = val;
    return v;
  };
  EXPECT_EQ(user_error(with(torchrun, "RANK", "4")),
            "RANK=4 is not below WORLD_SIZE=4 (ranks count from 0)");
  EXPECT_EQ(user_error(with(torchrun, "RANK", "x1")), "RANK='x1' is not a whole number >= 0");
  EXPECT_EQ(user_error(with(with(torchrun, "RANK", "1"), "MASTER_PORT", "70000")),
            "MASTER_PORT='70000' is not a TCP port (1 to 65535)");
  EXPECT_EQ(user_error(with(with(torchrun, "RANK", "1"), "MASTER_PORT", "")),
            "started by torchrun but MASTER_PORT is not set and --master-port was not given: "
            "name a free port on the host of rank 0 (torchrun sets both; another launcher must "
            "too)");
  EXPECT_EQ(user_error(with(with(torchrun, "RANK", "1"), "LOCAL_RANK", "2"),
                       LaunchFlags{}) /* no LOCAL_WORLD_SIZE: one node of 4 */,
            "(no error)");
  EXPECT_EQ(user_error(with(with(with(torchrun, "RANK", "1"), "LOCAL_RANK", "2"),
                            "LOCAL_WORLD_SIZE", "2")),
            "LOCAL_RANK=2 is not below the 2 ranks on its node");
  EXPECT_EQ(user_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}),
            "SLURM_NTASKS='0' is not a whole number >= 1");
  EXPECT_NE(user_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"MASTER_PORT", "1"},
                        {"SLURM_JOB_NODELIST", "n[1-"}})
                .find("cannot read the SLURM host list 'n[1-'"),
            std::string::npos);
  LaunchFlags f;
  f.master_port = 29500;
  f.nproc = 1;
  EXPECT_EQ(user_error(with(torchrun, "RANK", "0"), f).substr(0, 52),
            "torchrun (RANK=0, WORLD_SIZE=4) already started this");
}

TEST(LaunchEnv, BadCommandLineIsOneLine) {
  LaunchFlags f;
  f.nproc = 2;
  f.nnodes = 2;
  EXPECT_EQ(user_error({}, f), "--nnodes 2 needs --node-rank (this host's index, 0 to 1)");
  f.node_rank = 2;
  EXPECT_EQ(user_error({}, f), "--node-rank 2 is not in [0, --nnodes 2)");
  f.node_rank = 1;
  EXPECT_EQ(user_error({}, f), "--nnodes 2 needs --master-addr (the host of node 0, reachable "
                               "from every node) or MASTER_ADDR");
  f.master_addr = "h";
  EXPECT_EQ(user_error({}, f), "--nnodes 2 needs --master-port (a free port on node 0, the "
                               "same on every node) or MASTER_PORT");
  f.master_port = 0;
  EXPECT_EQ(user_error({}, f), "--master-port must be a TCP port (1 to 65535), got 0");
  f.master_port = 29500;
  f.nnodes = 0;
  EXPECT_EQ(user_error({}, f), "--nnodes must be >= 1, got 0");
}

TEST(LaunchEnv, ReadsTheProcessEnvironment) {
  // The default lookup reads the real environment (restored after).
  const char* names[] = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODELIST", "MASTER_PORT"};
  std::map<std::string, std::string> saved;
  for (const char* n : names)
    if (const char* v = std::getenv(n)) saved[n] = v;
  ::setenv("SLURM_PROCID", "1", 1);
  ::setenv("SLURM_NTASKS", "2", 1);
  ::setenv("SLURM_NODELIST", "x[5,9]", 1);
  ::setenv("MASTER_PORT", "29511", 1);
  LaunchEnv e;
  if (!std::getenv("RANK") && !std::getenv("SLURM_STEP_NODELIST") &&
      !std::getenv("SLURM_JOB_NODELIST") && !std::getenv("MASTER_ADDR"))
    e = resolve_launch({});
  for (const char* n : names) {
    if (saved.count(n)) ::setenv(n, saved[n].c_str(), 1);
    else ::unsetenv(n);
  }
  if (e.launcher != Launcher::Slurm) GTEST_SKIP() << "this shell already sets a launcher's variables";
  expect_place(e, 1, 2, 1, 2, 0, 1);
  EXPECT_EQ(e.master_addr, "x5");
  EXPECT_EQ(e.master_port, 29511);
}

TEST(ExpandNodelist, BracketRanges) {
  EXPECT_EQ(expand_nodelist("node1"), std::vector<std::string>{"node1"});
  EXPECT_EQ(expand_nodelist("gpu[01-03,7],login"),
            (std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu7", "login"}));
  EXPECT_EQ(expand_nodelist("a[8-10]-ib"),
            (std::vector<std::string>{"a8-ib", "a9-ib", "a10-ib"}));
  EXPECT_EQ(expand_nodelist("r[098-101]"),
            (std::vector<std::string>{"r098", "r099", "r100", "r101"}));
  EXPECT_THROW(expand_nodelist("a[3-1]"), UserError);
  EXPECT_THROW(expand_nodelist("a[1-2][3]"), UserError);
  EXPECT_THROW(expand_nodelist(""), UserError);
}

}  // namespace
}  // namespace fsdp::launch
