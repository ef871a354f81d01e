// Where this process's ranks come from (Note [Launch environments], docs/launch.md): the
// command line (fsdp forks its ranks, on one node or on each of --nnodes), torchrun, SLURM's
// srun, or mpirun. One function reads them all into one plain struct that the CPU and the
// CUDA launchers both use; bad or inconsistent input is a one-line fsdp::UserError.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::launch {

enum class Launcher {
  Fsdp,      // fsdp forks local_world_size ranks on this node (--nproc, --nnodes)
  Torchrun,  // RANK and WORLD_SIZE set: this process is one rank
  Slurm,     // srun: SLURM_PROCID and SLURM_NTASKS set
  Mpi,       // mpirun: OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/PMI_SIZE set
};
// "fsdp", "torchrun", "srun", "mpirun" (for messages).
const char* launcher_name(Launcher launcher);

// What the command line gave; unset fields were not given.
struct LaunchFlags {
  std::optional<int> nproc;  // ranks per node that fsdp forks (already resolved: >= 1)
  std::optional<int> nnodes, node_rank, master_port;
  std::optional<std::string> master_addr;
};

struct LaunchEnv {
  Launcher launcher = Launcher::Fsdp;
  // Launcher::Fsdp: this process launches the node's ranks; rank and local_rank are those of
  // its first (node_rank * local_world_size, 0): see for_local_rank(). Otherwise this process
  // is the one rank `rank`.
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  int node_rank = 0, nnodes = 1;
  // The store: host and port. On one node fsdp hosts it itself on 127.0.0.1, port 0 (a free
  // port, picked when the launcher starts it).
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // torchrun's agent already hosts a store on master_port (TORCHELASTIC_USE_AGENT_STORE):
  // every rank, rank 0 included, joins it instead of hosting one.
  bool agent_store = false;
  // Distinguishes this run's keys in a store that outlives it (torchrun's, across restarts).
  std::string run_id;
  // FSDP_STORE_SECRET (or the contents of FSDP_STORE_SECRET_FILE), "" when neither is set,
  // and FSDP_STORE_BIND: Note [Store access] in store_security.h. Never printed.
  std::string store_secret;
  std::string store_bind;

  // Whether this process hosts the store: the launching process of node 0 (Launcher::Fsdp),
  // else rank 0 unless torchrun's agent hosts it.
  bool hosts_store() const;
  // "rank 3 of 8 (local rank 1 of 4 on node 1 of 2), started by srun"
  std::string describe() const;
};

// Looks an environment variable up (nullptr when unset); the process's by default.
using EnvLookup = std::function<const char*(const char* name)>;
EnvLookup process_env();

// Which launcher started this process. The command line wins (--nproc, --nnodes or
// --node-rank given: fsdp forks the ranks), then torchrun, srun and mpirun, in that order.
Launcher detect_launcher(const LaunchFlags& flags, const EnvLookup& env = process_env());

// Rank, world size, local rank, nodes and the store's address, from the flags and the
// environment (precedence in docs/launch.md). Throws a one-line UserError for bad values
// (rank >= world size, a port out of range, MASTER_ADDR missing where nothing else names it).
LaunchEnv resolve_launch(const LaunchFlags& flags, const EnvLookup& env = process_env());

// For Launcher::Fsdp: the view of the rank that the node's launcher forks as `local_rank`.
LaunchEnv for_local_rank(const LaunchEnv& node, int local_rank);

// SLURM's host lists: "gpu[01-03,7],login" -> gpu01 gpu02 gpu03 gpu7 login (one bracket per
// host name; zero padding kept). Throws a UserError for a list it cannot read.
std::vector<std::string> expand_nodelist(const std::string& list);

}  // namespace fsdp::launch
