// The rendezvous store over TCP (Note [TCP store protocol]). One process hosts the server
// (rank 0, or the launcher's parent, which outlives its ranks); every rank is a client.
//
//   TcpStoreServer server(0);                        // port 0: the kernel picks a free one
//   TcpStore store({"10.0.0.1", server.port(), Millis(60000)});
//   store.set("nccl_id", bytes);  ... store.barrier("start", rank, world, timeout);
//
// A client retries its connection until the timeout, and fails naming the address, the port
// and how long it tried. Every reply is awaited at most that long, so a store whose host
// vanished ends the wait; one that closed the connection (its process died) fails the very
// next operation, even one waiting in get() or a barrier.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "rendezvous/store.h"

namespace fsdp::rendezvous {

// Hosts the keys on a thread of this process. Destroying it closes every client's connection.
//
// A launcher that forks its ranks after making the server passes start = false, forks, calls
// start() in the parent and close_in_child() in each child: the children then hold no copy
// of the server's sockets (a copy would keep the store "alive" to its clients after the
// parent died), and no connection is accepted before the forks.
class TcpStoreServer {
 public:
  // Listens on every interface at `port` (0: a free port, see port()); serves from now on
  // unless `start` is false. Throws fsdp::Error naming the port when it cannot listen.
  explicit TcpStoreServer(int port, bool start = true);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  void start();
  // In a child forked from the process that made this server: closes its sockets there.
  void close_in_child();
  // Stops serving and closes every connection (clients then fail promptly). Idempotent.
  void stop();

 private:
  void serve();

  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};  // stop() writes here to end serve()'s poll()
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // where the server runs
  int port = 0;                    // its port (a client needs the real one, not 0)
  Millis timeout{60000};           // connection retries, and the wait for each reply
};

class TcpStore final : public Store {
 public:
  // Connects (retrying until options.timeout) to the server at options.host:options.port.
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
  void send_bytes(const std::string& bytes);
  void recv_bytes(char* out, size_t n);
  [[noreturn]] void lost(const std::string& why);

  TcpStoreOptions options_;
  int fd_ = -1;
  bool notice_armed_ = false;
  std::mutex mu_;  // one request and its reply at a time
};

// Rank 0 hosts a server and is a client of it; the others are clients. `port` 0 asks the
// host for a free port (server->port() says which; clients need the real one).
struct HostedStore {
  std::unique_ptr<TcpStoreServer> server;  // null on a client
  std::shared_ptr<TcpStore> store;
};
HostedStore host_or_join_tcp_store(bool host, const std::string& addr, int port, Millis timeout);

}  // namespace fsdp::rendezvous
