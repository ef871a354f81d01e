// One client connection of the store's server, and the parsing of what it sends
// (tcp_store_requests.cpp); the event loop that owns them is tcp_store_server.cpp.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "rendezvous/tcp_store.h"

namespace fsdp::rendezvous::server {

using Clock = std::chrono::steady_clock;
using KeyValues = std::map<std::string, std::string>;

struct Connection {
  int fd = -1;
  enum class Stage { Hello, Proof, Admitted } stage = Stage::Hello;
  Clock::time_point auth_deadline;
  bool closing = false;  // refused: send what is pending, then close
  bool closed = false;
  // Input and output, consumed from the front by offset (moving bytes once per read, not
  // once per request: Note [Store limits]).
  std::string in, out;
  size_t in_pos = 0, out_pos = 0;
  std::string client_nonce, server_nonce;
  std::string notice_count_key, notice_key, notice;  // armed while notice is not empty

  size_t unparsed() const { return in.size() - in_pos; }
  size_t pending_out() const { return out.size() - out_pos; }
  bool admitted() const { return stage == Stage::Admitted; }
};

// What serving one connection may do, and what it did.
struct ServePolicy {
  const std::string& secret;
  bool open;
  const TcpStoreLimits& limits;
  uint64_t max_request_bytes;  // a request that cannot fit in this is malformed
};
struct ServeCounts {
  uint64_t requests = 0, admitted = 0, refused_secrets = 0, dropped_unadmitted = 0;
};

// Serves the complete requests at the front of c's input (the handshake first), until none
// is left, c's unread replies reach the limit, or c is closed (a malformed request, a
// command before admission, a wrong secret).
void serve_requests(Connection& c, KeyValues& kv, const ServePolicy& policy, ServeCounts& counts);

// ADD: the key's new value, or false when it holds no number.
bool add_to(KeyValues& kv, const std::string& key, int64_t delta, int64_t& now);

}  // namespace fsdp::rendezvous::server
