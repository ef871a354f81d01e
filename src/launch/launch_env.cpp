// Note [Launch environments]
// A process learns its place in the job from, in this order:
//   1. the command line: --nproc / --nnodes / --node-rank given means fsdp forks this node's
//      ranks itself (also inside an sbatch script, whose environment already has SLURM_PROCID);
//   2. torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
//      MASTER_PORT; with TORCHELASTIC_USE_AGENT_STORE=True torchrun's agent already serves a
//      store on MASTER_PORT, which every rank joins (Note [TCP store protocol]); otherwise
//      MASTER_PORT is free and rank 0 hosts ours there;
//   3. srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NNODES, SLURM_NODEID; the store
//      is on the first host of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) unless
//      MASTER_ADDR says otherwise;
//   4. mpirun: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE (Open MPI) or PMI_RANK,
//      PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS (MPICH); MPI names no store host, so
//      MASTER_ADDR and MASTER_PORT must come with the job (mpirun -x).
// --master-addr and --master-port override MASTER_ADDR and MASTER_PORT under every launcher.
// Nothing falls back to a guessed port: a missing one is a one-line error.
#include "launch/launch_env.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "fsdp/error.h"
#include "launch/store_security.h"

namespace fsdp::launch {

namespace {

// An integer in [lo, hi] from `text`; `source` names it in the message ("RANK", "--nnodes").
int parse_int(const std::string& source, const std::string& text, int lo, int hi,
              const std::string& expected) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  const bool whole = !text.empty() && end && *end == '\0' && errno == 0 &&
                     text.find_first_of(" \t+") == std::string::npos;
  FSDP_USER_CHECK(whole && v >= lo && v <= hi, source, "='", text, "' is not ", expected);
  return static_cast<int>(v);
}

struct Reader {
  const EnvLookup& env;
  bool has(const char* name) const {
    const char* v = env(name);
    return v && *v;
  }
  std::optional<std::string> text(const char* name) const {
    if (!has(name)) return std::nullopt;
    return std::string(env(name));
  }
  std::optional<int> count(const char* name, int lo = 0) const {
    if (!has(name)) return std::nullopt;
    return parse_int(name, env(name), lo, 1 << 30,
                     lo == 0 ? "a whole number >= 0" : "a whole number >= 1");
  }
};

constexpr int kMaxPort = 65535;

int flag_port(int port) {
  FSDP_USER_CHECK(port >= 1 && port <= kMaxPort, "--master-port must be a TCP port (1 to ",
                  kMaxPort, "), got ", port);
  return port;
}

// The store's address under an external launcher: flags, then MASTER_ADDR/MASTER_PORT, then
// `fallback_host` (SLURM's first node; empty: none).
void resolve_store_address(LaunchEnv& e, const LaunchFlags& flags, const Reader& r,
                           const std::string& fallback_host, const std::string& how_to) {
  const std::string who = launcher_name(e.launcher);
  if (flags.master_addr) e.master_addr = *flags.master_addr;
  else if (auto a = r.text("MASTER_ADDR")) e.master_addr = *a;
  else if (!fallback_host.empty()) e.master_addr = fallback_host;
  else
    FSDP_USER_FAIL("started by ", who, " but MASTER_ADDR is not set and --master-addr was not "
                   "given: name the host of rank 0 (", how_to, ")");
  if (flags.master_port) e.master_port = flag_port(*flags.master_port);
  else if (auto p = r.text("MASTER_PORT"))
    e.master_port = parse_int("MASTER_PORT", *p, 1, kMaxPort, "a TCP port (1 to 65535)");
  else
    FSDP_USER_FAIL("started by ", who, " but MASTER_PORT is not set and --master-port was not "
                   "given: name a free port on the host of rank 0 (", how_to, ")");
}

void check_place(const LaunchEnv& e, const char* rank_name, const char* world_name,
                 const char* local_name) {
  FSDP_USER_CHECK(e.world_size >= 1, world_name, "=", e.world_size, " must be >= 1");
  FSDP_USER_CHECK(e.rank < e.world_size, rank_name, "=", e.rank, " is not below ", world_name,
                  "=", e.world_size, " (ranks count from 0)");
  FSDP_USER_CHECK(e.local_world_size >= 1 && e.local_world_size <= e.world_size,
                  "the ranks per node (", e.local_world_size, ") must be in [1, ", world_name,
                  "=", e.world_size, "]");
  FSDP_USER_CHECK(e.local_rank < e.local_world_size, local_name, "=", e.local_rank,
                  " is not below the ", e.local_world_size, " ranks on its node");
  FSDP_USER_CHECK(e.node_rank < e.nnodes, "node ", e.node_rank, " is not below the ", e.nnodes,
                  " nodes of the job");
}

LaunchEnv from_command_line(const LaunchFlags& f, const Reader& r) {
  LaunchEnv e;
  e.launcher = Launcher::Fsdp;
  e.nnodes = f.nnodes.value_or(1);
  FSDP_USER_CHECK(e.nnodes >= 1, "--nnodes must be >= 1, got ", e.nnodes);
  FSDP_USER_CHECK(f.node_rank || e.nnodes == 1, "--nnodes ", e.nnodes,
                  " needs --node-rank (this host's index, 0 to ", e.nnodes - 1, ")");
  e.node_rank = f.node_rank.value_or(0);
  FSDP_USER_CHECK(e.node_rank >= 0 && e.node_rank < e.nnodes, "--node-rank ", e.node_rank,
                  " is not in [0, --nnodes ", e.nnodes, ")");
  e.local_world_size = f.nproc.value_or(1);
  FSDP_USER_CHECK(e.local_world_size >= 1, "--nproc must be >= 1 here, got ", e.local_world_size);
  e.world_size = e.nnodes * e.local_world_size;
  e.rank = e.node_rank * e.local_world_size;
  e.local_rank = 0;
  const bool multi = e.nnodes > 1;
  if (f.master_addr) e.master_addr = *f.master_addr;
  else if (auto a = r.text("MASTER_ADDR")) e.master_addr = *a;
  else
    FSDP_USER_CHECK(!multi, "--nnodes ", e.nnodes, " needs --master-addr (the host of node 0, "
                    "reachable from every node) or MASTER_ADDR");
  if (f.master_port) e.master_port = flag_port(*f.master_port);
  else if (auto p = r.text("MASTER_PORT"))
    e.master_port = parse_int("MASTER_PORT", *p, 1, kMaxPort, "a TCP port (1 to 65535)");
  else
    FSDP_USER_CHECK(!multi, "--nnodes ", e.nnodes, " needs --master-port (a free port on node "
                    "0, the same on every node) or MASTER_PORT");
  FSDP_USER_CHECK(!f.master_addr || !f.master_addr->empty(), "--master-addr must not be empty");
  return e;
}

LaunchEnv from_torchrun(const LaunchFlags& f, const Reader& r) {
  LaunchEnv e;
  e.launcher = Launcher::Torchrun;
  e.rank = *r.count("RANK");
  e.world_size = *r.count("WORLD_SIZE", 1);
  e.local_world_size = r.count("LOCAL_WORLD_SIZE", 1).value_or(e.world_size);
  e.local_rank = r.count("LOCAL_RANK").value_or(e.rank % e.local_world_size);
  e.nnodes = r.count("GROUP_WORLD_SIZE", 1)
                 .value_or((e.world_size + e.local_world_size - 1) / e.local_world_size);
  e.node_rank = r.count("GROUP_RANK").value_or(e.rank / e.local_world_size);
  check_place(e, "RANK", "WORLD_SIZE", "LOCAL_RANK");
  resolve_store_address(e, f, r, "", "torchrun sets both; another launcher must too");
  const std::string agent = r.text("TORCHELASTIC_USE_AGENT_STORE").value_or("");
  e.agent_store = agent == "True" || agent == "true" || agent == "1";
  if (auto id = r.text("TORCHELASTIC_RUN_ID")) e.run_id = *id;
  if (auto restart = r.text("TORCHELASTIC_RESTART_COUNT")) e.run_id += "." + *restart;
  return e;
}

// SLURM_NTASKS_PER_NODE, else the first count of SLURM_TASKS_PER_NODE ("4(x2),3"), else
// the tasks spread evenly.
int slurm_tasks_per_node(const Reader& r, int world, int nnodes) {
  if (auto n = r.count("SLURM_NTASKS_PER_NODE", 1)) return *n;
  if (auto t = r.text("SLURM_TASKS_PER_NODE")) {
    const std::string first = t->substr(0, t->find_first_of("(,"));
    return parse_int("SLURM_TASKS_PER_NODE", first, 1, 1 << 30, "a task count such as 4(x2)");
  }
  return (world + nnodes - 1) / nnodes;
}

LaunchEnv from_slurm(const LaunchFlags& f, const Reader& r) {
  LaunchEnv e;
  e.launcher = Launcher::Slurm;
  e.rank = *r.count("SLURM_PROCID");
  e.world_size = *r.count("SLURM_NTASKS", 1);
  e.nnodes = r.count("SLURM_NNODES", 1).value_or(1);
  e.node_rank = r.count("SLURM_NODEID").value_or(0);
  e.local_world_size = slurm_tasks_per_node(r, e.world_size, e.nnodes);
  e.local_rank = r.count("SLURM_LOCALID").value_or(e.rank % e.local_world_size);
  check_place(e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID");
  std::string first_host;
  for (const char* list : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (auto l = r.text(list); l && first_host.empty()) first_host = expand_nodelist(*l).at(0);
  resolve_store_address(e, f, r, first_host, "export MASTER_PORT, or pass --master-port");
  if (auto job = r.text("SLURM_JOB_ID")) e.run_id = *job + "." + r.text("SLURM_STEP_ID").value_or("");
  return e;
}

LaunchEnv from_mpi(const LaunchFlags& f, const Reader& r) {
  LaunchEnv e;
  e.launcher = Launcher::Mpi;
  const bool ompi = r.has("OMPI_COMM_WORLD_RANK") && r.has("OMPI_COMM_WORLD_SIZE");
  const char* rank_name = ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
  const char* size_name = ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
  const char* local_name = ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID";
  e.rank = *r.count(rank_name);
  e.world_size = *r.count(size_name, 1);
  // MPI names no node index: nodes are taken as filled in rank order (mpirun's default).
  e.local_world_size =
      r.count(ompi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS", 1).value_or(e.world_size);
  e.local_rank = r.count(local_name).value_or(e.rank % e.local_world_size);
  e.nnodes = (e.world_size + e.local_world_size - 1) / e.local_world_size;
  e.node_rank = e.rank / e.local_world_size;
  check_place(e, rank_name, size_name, local_name);
  resolve_store_address(e, f, r, "",
                        "e.g. mpirun -x MASTER_ADDR=host0 -x MASTER_PORT=29500, or pass "
                        "--master-addr and --master-port");
  return e;
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::Fsdp: return "fsdp";
    case Launcher::Torchrun: return "torchrun";
    case Launcher::Slurm: return "srun";
    case Launcher::Mpi: return "mpirun";
  }
  return "?";
}

bool LaunchEnv::hosts_store() const {
  if (launcher == Launcher::Fsdp) return node_rank == 0;
  return rank == 0 && !agent_store;
}

std::string LaunchEnv::describe() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local rank " +
         std::to_string(local_rank) + " of " + std::to_string(local_world_size) + " on node " +
         std::to_string(node_rank) + " of " + std::to_string(nnodes) + "), started by " +
         launcher_name(launcher);
}

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

Launcher detect_launcher(const LaunchFlags& flags, const EnvLookup& env) {
  const Reader r{env};
  if (flags.nproc || flags.nnodes || flags.node_rank) return Launcher::Fsdp;
  if (r.has("RANK") && r.has("WORLD_SIZE")) return Launcher::Torchrun;
  if (r.has("SLURM_PROCID") && r.has("SLURM_NTASKS")) return Launcher::Slurm;
  if ((r.has("OMPI_COMM_WORLD_RANK") && r.has("OMPI_COMM_WORLD_SIZE")) ||
      (r.has("PMI_RANK") && r.has("PMI_SIZE")))
    return Launcher::Mpi;
  return Launcher::Fsdp;
}

LaunchEnv resolve_launch(const LaunchFlags& flags, const EnvLookup& env) {
  const Reader r{env};
  const bool fsdp_flags = flags.nproc || flags.nnodes || flags.node_rank;
  if (fsdp_flags && r.has("RANK") && r.has("WORLD_SIZE"))
    FSDP_USER_FAIL("torchrun (RANK=", r.text("RANK").value_or(""), ", WORLD_SIZE=",
                   r.text("WORLD_SIZE").value_or(""), ") already started this process as one "
                   "rank; drop --nproc, --nnodes and --node-rank (torchrun's --nproc-per-node "
                   "and --nnodes say how many)");
  LaunchEnv e;
  switch (detect_launcher(flags, env)) {
    case Launcher::Fsdp: e = from_command_line(flags, r); break;
    case Launcher::Torchrun: e = from_torchrun(flags, r); break;
    case Launcher::Slurm: e = from_slurm(flags, r); break;
    case Launcher::Mpi: e = from_mpi(flags, r); break;
  }
  read_store_access(e, env);
  return e;
}

LaunchEnv for_local_rank(const LaunchEnv& node, int local_rank) {
  FSDP_CHECK(node.launcher == Launcher::Fsdp && local_rank >= 0 &&
                 local_rank < node.local_world_size,
             "local rank ", local_rank, " of ", node.local_world_size);
  LaunchEnv e = node;
  e.local_rank = local_rank;
  e.rank = node.node_rank * node.local_world_size + local_rank;
  return e;
}

std::vector<std::string> expand_nodelist(const std::string& list) {
  std::vector<std::string> hosts;
  size_t i = 0;
  auto bad = [&](const std::string& why) {
    FSDP_USER_FAIL("cannot read the SLURM host list '", list, "': ", why);
  };
  while (i < list.size()) {
    // One host name, up to a comma outside brackets.
    size_t end = i;
    int depth = 0;
    for (; end < list.size() && (depth > 0 || list[end] != ','); ++end)
      depth += list[end] == '[' ? 1 : list[end] == ']' ? -1 : 0;
    const std::string item = list.substr(i, end - i);
    i = end + 1;
    if (item.empty()) bad("an empty host name");
    const size_t open = item.find('[');
    if (open == std::string::npos) {
      hosts.push_back(item);
      continue;
    }
    const size_t close = item.find(']', open);
    if (close == std::string::npos) bad("a '[' without its ']'");
    if (item.find('[', close) != std::string::npos) bad("more than one bracket in a host name");
    const std::string prefix = item.substr(0, open), suffix = item.substr(close + 1);
    const std::string ranges = item.substr(open + 1, close - open - 1);
    size_t p = 0;
    while (p <= ranges.size()) {
      const size_t comma = std::min(ranges.find(',', p), ranges.size());
      const std::string range = ranges.substr(p, comma - p);
      p = comma + 1;
      const size_t dash = range.find('-');
      const std::string lo_text = range.substr(0, dash);
      const std::string hi_text = dash == std::string::npos ? lo_text : range.substr(dash + 1);
      if (lo_text.empty() || hi_text.empty() ||
          lo_text.find_first_not_of("0123456789") != std::string::npos ||
          hi_text.find_first_not_of("0123456789") != std::string::npos || lo_text.size() > 9 ||
          hi_text.size() > 9)
        bad("'" + range + "' is not a number or a range a-b");
      const long lo = std::stol(lo_text), hi = std::stol(hi_text);
      if (hi < lo) bad("the range '" + range + "' runs backwards");
      if (hi - lo > 100000) bad("the range '" + range + "' is too long");
      for (long n = lo; n <= hi; ++n) {
        std::string num = std::to_string(n);
        if (num.size() < lo_text.size()) num.insert(0, lo_text.size() - num.size(), '0');
        hosts.push_back(prefix + num + suffix);
      }
    }
  }
  if (hosts.empty()) bad("no host");
  return hosts;
}

}  // namespace fsdp::launch
