// The rendezvous store over TCP (Note [TCP store protocol]). One process hosts the server
// (rank 0, or the launcher's parent, which outlives its ranks); every rank is a client.
//
//   TcpStoreServer server({.bind_address = "10.0.0.1", .secret = secret});  // a free port
//   TcpStore store({"10.0.0.1", server.port(), Millis(60000), secret});
//   store.set("nccl_id", bytes);  ... store.barrier("start", rank, world, timeout);
//
// A client retries its connection until the timeout, and fails naming the address, the port
// and how long it tried. Every reply is awaited at most that long, so a store whose host
// vanished ends the wait; one that closed the connection (its process died) fails the very
// next operation, even one waiting in get() or a barrier.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "rendezvous/store.h"
#include "rendezvous/tcp_store_wire.h"

namespace fsdp::rendezvous {

// What one client may cost the server (Note [Store limits] in tcp_store_server.cpp). The
// defaults are far above what a job's ranks ask of it; tests make them small.
struct TcpStoreLimits {
  uint64_t max_value_bytes = wire::kDefaultMaxValueBytes;  // a larger SET closes its connection
  // Replies a client has not read yet: past this the server serves it nothing more (and
  // reads nothing more from it) until it has read some.
  uint64_t max_pending_reply_bytes = 32ull << 20;
  int max_connections = 1024;     // past it a newcomer is closed at once (it may retry)
  int max_unauthenticated = 64;   // past it the oldest not yet admitted is dropped
  Millis auth_timeout{5000};      // a connection not admitted by then is dropped
};

struct TcpStoreServerOptions {
  // Where to listen: an address of this host (IPv4 or IPv6, or a name that resolves to one),
  // or "*" for every interface (only when asked for: docs/launch.md, FSDP_STORE_BIND).
  std::string bind_address = "127.0.0.1";
  int port = 0;  // 0: a free port, see port()
  // The job's secret (Note [Store authentication]): a client is admitted once it proved
  // that it knows it. Required unless `open`.
  std::string secret;
  // Admit every client without a secret, as torchrun's agent store does (tests that play
  // that store use it; fsdp never serves a job so).
  bool open = false;
  TcpStoreLimits limits;
  bool start = true;  // serve from now on (see start())
};

// Hosts the keys on a thread of this process. Destroying it closes every client's connection.
//
// A launcher that forks its ranks after making the server passes start = false, forks, calls
// start() in the parent and close_in_child() in each child: the children then hold no copy
// of the server's sockets (a copy would keep the store "alive" to its clients after the
// parent died), and no connection is accepted before the forks.
class TcpStoreServer {
 public:
  // Listens on options.bind_address at options.port. Throws fsdp::Error naming the address
  // and the port when it cannot listen there.
  explicit TcpStoreServer(const TcpStoreServerOptions& options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // The address it listens on, as the kernel has it ("127.0.0.1", "::" for every interface).
  const std::string& listen_address() const { return listen_address_; }
  // Where a client on this host reaches it (127.0.0.1 when it listens on every interface).
  const std::string& connect_host() const { return connect_host_; }
  void start();
  // In a child forked from the process that made this server: closes its sockets there.
  void close_in_child();
  // Stops serving and closes every connection (clients then fail promptly). Idempotent.
  void stop();

  // What the server has done so far (tests, and the bounds of Note [Store limits]).
  struct Stats {
    uint64_t polls = 0;                 // returns from poll(): each handled an event
    uint64_t accepted = 0;              // connections taken in
    uint64_t admitted = 0;              // ... that proved the secret (or validated, if open)
    uint64_t refused_secrets = 0;       // ... that answered the challenge wrongly
    uint64_t dropped_unadmitted = 0;    // closed before admission: timed out, evicted, or a
                                        // command before the handshake
    uint64_t turned_away = 0;           // closed on arrival (at max_connections, or no fd)
    uint64_t requests = 0;              // commands served to admitted clients
    uint64_t input_bytes = 0;           // bytes read from clients
    uint64_t input_bytes_moved = 0;     // bytes moved to compact input buffers
    uint64_t peak_pending_reply_bytes = 0;  // the most one client had unread at once
    uint64_t open_connections = 0;      // now
  };
  Stats stats() const;

 private:
  struct Counters;
  void serve();

  TcpStoreServerOptions options_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};  // stop() writes here to end serve()'s poll()
  int reserve_fd_ = -1;          // given up to accept (and close) a newcomer when out of fds
  int port_ = 0;
  std::string listen_address_, connect_host_;
  std::shared_ptr<Counters> counters_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // where the server runs
  int port = 0;                    // its port (a client needs the real one, not 0)
  Millis timeout{60000};           // connection retries, and the wait for each reply
  // The job's secret, proved to our server (Note [Store authentication]); empty for
  // torchrun's agent store, which takes none.
  std::string secret;
};

class TcpStore final : public Store {
 public:
  // Connects (retrying until options.timeout) to the server at options.host:options.port,
  // and with a secret, authenticates both ways. A server that refuses the secret, or does
  // not prove that it knows it, fails at once with a message that says so.
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Millis timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<bool> check(const std::vector<std::string>& keys) override;

  // Our server only (never torchrun's agent store): should this connection close before
  // this client is destroyed (its process killed, crashed, or _exit), the server adds 1 to
  // count_key and, if that made it 1, sets key to text. Destroying the client disarms it.
  void set_disconnect_notice(const std::string& count_key, const std::string& key,
                             const std::string& text);

  // "host:port" of the server, for messages.
  std::string address() const;

 private:
  // One connection and handshake; false when the server closed it during the handshake
  // (it may be turning newcomers away for now: the caller retries).
  bool handshake();
  // Both throw when the store closed the connection, unless eof_ok (then they return false).
  bool send_bytes(const std::string& bytes, bool eof_ok = false);
  bool recv_bytes(char* out, size_t n, bool eof_ok = false);
  [[noreturn]] void lost(const std::string& why);

  TcpStoreOptions options_;
  int fd_ = -1;
  bool notice_armed_ = false;
  std::mutex mu_;  // one request and its reply at a time
};

// Rank 0 hosts a server and is a client of it; the others are clients. `port` 0 asks the
// host for a free port (server->port() says which; clients need the real one). The host
// listens on `bind_address`; everyone else connects to `addr`. `secret` empty: the store
// is torchrun's agent store (no host then), which takes none.
struct HostedStore {
  std::unique_ptr<TcpStoreServer> server;  // null on a client
  std::shared_ptr<TcpStore> store;
};
HostedStore host_or_join_tcp_store(bool host, const std::string& addr, int port, Millis timeout,
                                   const std::string& secret, const std::string& bind_address);

}  // namespace fsdp::rendezvous
