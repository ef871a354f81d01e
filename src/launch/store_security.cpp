// See Note [Store access] in store_security.h.
#include "launch/store_security.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstdio>

#include "fsdp/error.h"
#include "rendezvous/store_auth.h"

namespace fsdp::launch {

namespace {

bool set(const char* v) { return v && *v; }

// Whether the secret is for ranks that do not share one launcher's memory.
bool needs_shared_secret(const LaunchEnv& e) {
  return e.launcher == Launcher::Fsdp ? e.nnodes > 1 : !e.agent_store;
}

// A name (not an address) that this host resolves to loopback addresses only, such as the
// host's own name that Debian maps to 127.0.1.1.
bool name_resolves_to_loopback_only(const std::string& host) {
  in6_addr six{};
  in_addr four{};
  if (host == "localhost" || ::inet_pton(AF_INET, host.c_str(), &four) == 1 ||
      ::inet_pton(AF_INET6, host.c_str(), &six) == 1)
    return false;
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  bool loopback_only = true;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr.s_addr);
      loopback_only = loopback_only && (a >> 24) == 127;
    } else if (ai->ai_family == AF_INET6) {
      const in6_addr& a = reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr;
      loopback_only = loopback_only && IN6_IS_ADDR_LOOPBACK(&a);
    }
  }
  ::freeaddrinfo(res);
  return loopback_only;
}

}  // namespace

void read_store_access(LaunchEnv& e, const EnvLookup& env) {
  if (const char* bind = env("FSDP_STORE_BIND"); set(bind)) e.store_bind = bind;
  if (!needs_shared_secret(e)) return;  // a secret here would not be used: not read either
  const char* secret = env("FSDP_STORE_SECRET");
  const char* file = env("FSDP_STORE_SECRET_FILE");
  FSDP_USER_CHECK(!(set(secret) && set(file)),
                  "FSDP_STORE_SECRET and FSDP_STORE_SECRET_FILE are both set: set one of them");
  if (set(secret)) {
    rendezvous::auth::check_secret(secret, "FSDP_STORE_SECRET");
    e.store_secret = secret;
  } else if (set(file)) {
    e.store_secret = rendezvous::auth::read_secret_file(file);
  }
}

std::string job_store_secret(const LaunchEnv& e) {
  if (!needs_shared_secret(e)) return e.agent_store ? "" : rendezvous::auth::new_secret();
  if (!e.store_secret.empty()) return e.store_secret;
  if (e.launcher == Launcher::Fsdp)
    FSDP_USER_FAIL("--nnodes ", e.nnodes, ": the launchers of every node meet at node 0's store, "
                   "which admits only those that know the job's secret: set FSDP_STORE_SECRET "
                   "(e.g. to the output of `openssl rand -hex 32`) or FSDP_STORE_SECRET_FILE to "
                   "the same on every node");
  FSDP_USER_FAIL("started by ", launcher_name(e.launcher), ", the ranks meet at rank 0's store, "
                 "which admits only those that know the job's secret: export FSDP_STORE_SECRET "
                 "(e.g. FSDP_STORE_SECRET=$(openssl rand -hex 32)) or FSDP_STORE_SECRET_FILE to "
                 "every rank", e.launcher == Launcher::Mpi ? " (mpirun -x FSDP_STORE_SECRET)" : "");
}

std::string store_bind_address(const LaunchEnv& e) {
  if (!e.store_bind.empty()) return e.store_bind;
  if (e.launcher == Launcher::Fsdp && e.nnodes == 1) return "127.0.0.1";
  if (e.nnodes > 1 && name_resolves_to_loopback_only(e.master_addr))
    std::fprintf(stderr, "fsdp: warning: the master address '%s' is a loopback address on this "
                 "host, so the store listens there and ranks on other hosts cannot reach it; give "
                 "node 0's network address (or set FSDP_STORE_BIND)\n", e.master_addr.c_str());
  return e.master_addr;
}

std::unique_ptr<rendezvous::TcpStoreServer> bind_job_store(const LaunchEnv& e, int port,
                                                           const std::string& secret) {
  rendezvous::TcpStoreServerOptions o;
  o.bind_address = store_bind_address(e);
  o.port = port;
  o.secret = secret;
  o.start = false;
  return std::make_unique<rendezvous::TcpStoreServer>(o);
}

}  // namespace fsdp::launch
