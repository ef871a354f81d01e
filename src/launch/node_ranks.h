// Ranks as processes of one node, meeting at the rendezvous store: what `--nproc` (and each
// node of `--nnodes`) does, for any back-end (Note [Launching on GPUs]).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "launch/launch_env.h"
#include "rendezvous/store.h"
#include "rendezvous/tcp_store.h"

namespace fsdp::launch {

// One rank's work in a forked child: `rank` is its place in the job, `store` the job's store
// (already connected). What it returns travels back to the parent.
using RankMain = std::function<std::string(const LaunchEnv& rank, rendezvous::Store& store)>;

// Forks node.local_world_size children, one per local rank, and waits for them all. On node 0
// this process hosts the store (on node.master_port, or a free port when it is 0) for as
// long as its ranks run; every child connects to it (within `timeout`) before rank_main runs.
// If a child fails (an exception, a signal, a non-zero exit) the others are sent SIGTERM and
// an fsdp::Error is thrown after all have ended; otherwise returns each local rank's result.
std::vector<std::string> run_node_ranks(const LaunchEnv& node, rendezvous::Millis timeout,
                                        const RankMain& rank_main);

// For a process that is one rank of an external launcher (torchrun, srun, mpirun): hosts the
// store on rank 0 (LaunchEnv::hosts_store) or joins it. Joining torchrun's agent store makes
// one round trip first, so a store that does not speak the protocol of Note [TCP store
// protocol] fails here with a message that says so.
rendezvous::HostedStore open_rank_store(const LaunchEnv& rank, rendezvous::Millis timeout);
// The keys of one run in an external launcher's store: "fsdp[/run_id]/<backend>" (torchrun's
// store outlives a restart).
std::string run_key_prefix(const LaunchEnv& rank, const char* backend);
// Note [Failure notices]: no launcher of ours reaps this rank, so its connection to our store
// is armed with the notice of its death, among the keys of run_key_prefix(rank, backend).
// Nothing on the host of the store (its death ends the store) or under torchrun's agent store
// (not our server).
void arm_failure_notice(const LaunchEnv& rank, const rendezvous::HostedStore& hosted,
                        const char* backend);

}  // namespace fsdp::launch
