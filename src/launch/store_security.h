// Note [Store access]
// Whoever reaches the store's port could read every key (a rank's Gloo address), write any
// (redirect a Gloo connection, forge the job's failure notice), or hold it busy. So:
//  - Where it listens (store_bind_address): on 127.0.0.1 when every rank is on this host
//    (fsdp's launcher on one node); otherwise on the address --master-addr (MASTER_ADDR)
//    names, which is this host's (a loopback one when the "nodes" are all here), never on
//    every interface unless FSDP_STORE_BIND=* asks for it. FSDP_STORE_BIND=ADDR picks
//    another address of this host.
//  - Who may join (job_store_secret, Note [Store authentication]): clients that prove they
//    know the job's secret. fsdp's launcher on one node makes a fresh one and its forked
//    ranks inherit it; launchers on several nodes, and ranks started by torchrun, srun or
//    mpirun that meet at our store, read the same one from FSDP_STORE_SECRET or
//    FSDP_STORE_SECRET_FILE. Under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE)
//    there is no secret: that store is torchrun's, and takes none.
//  - What one client may cost it: Note [Store limits].
#pragma once

#include <memory>
#include <string>

#include "launch/launch_env.h"
#include "rendezvous/tcp_store.h"

namespace fsdp::launch {

// Reads FSDP_STORE_SECRET or FSDP_STORE_SECRET_FILE (not both) and FSDP_STORE_BIND into `e`
// (for resolve_launch); a one-line UserError for a bad secret or file.
void read_store_access(LaunchEnv& e, const EnvLookup& env);

// The secret of e's job: "" under torchrun's agent store; a new one when fsdp's launcher
// runs the whole job on this node; otherwise e.store_secret, which must have been given
// (a one-line UserError saying how, if not).
std::string job_store_secret(const LaunchEnv& e);

// Where the host of e's store listens (see the Note).
std::string store_bind_address(const LaunchEnv& e);

// The server of e's store on `port` (0: any), admitting `secret`'s clients: bound now, so its
// port is known, and served once started (after the launcher's forks, so that no child
// inherits a serving thread).
std::unique_ptr<rendezvous::TcpStoreServer> bind_job_store(const LaunchEnv& e, int port,
                                                           const std::string& secret);

}  // namespace fsdp::launch
