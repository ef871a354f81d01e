// The rendezvous store's client (Note [TCP store protocol] in tcp_store_server.cpp).
#include "rendezvous/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "fsdp/error.h"
#include "rendezvous/store_auth.h"
#include "rendezvous/tcp_store_wire.h"

namespace fsdp::rendezvous {

using namespace wire;

namespace {

using Clock = std::chrono::steady_clock;

std::string seconds_text(Millis t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// One connection attempt to each address of host:port; the connected socket, or -1 and why.
int try_connect(const std::string& host, int port, int wait_ms, std::string& error) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    error = std::string("cannot resolve the host: ") + ::gai_strerror(rc);
    return -1;
  }
  int connected = -1;
  for (addrinfo* ai = res; ai && connected < 0; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int rc2 = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc2 != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, std::max(wait_ms, 1)) == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        errno = err;
        rc2 = err == 0 ? 0 : -1;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc2 == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      connected = fd;
    } else {
      error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(res);
  return connected;
}

}  // namespace

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options) {
  FSDP_CHECK(options.port > 0 && options.port <= 65535,
             "the store's port must be in [1, 65535], got ", options.port);
  const auto start = Clock::now();
  const auto deadline = start + options.timeout;
  std::string error = "timed out";
  Millis pause(10);
  for (;;) {
    fd_ = try_connect(options.host, options.port, std::min(remaining_ms(deadline), 5000), error);
    if (fd_ >= 0) {
      if (handshake()) break;
      // Closed before admitting us: a server at its limit turns newcomers away for now.
      ::close(fd_);
      fd_ = -1;
      error = "it closed the connection before admitting this client (is it fsdp's store?)";
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min<Millis>(pause, Millis(remaining_ms(deadline))));
    pause = std::min(pause * 2, Millis(500));
  }
  if (fd_ < 0)
    FSDP_USER_FAIL("rendezvous: could not connect to the store at ", address(), " (tried for ",
              seconds_text(std::chrono::duration_cast<Millis>(Clock::now() - start)),
              "; last error: ", error,
              "); is the process that hosts it (rank 0) running, and are the address and "
              "port right?");
}

bool TcpStore::handshake() {
  std::string hello;
  put_uint(hello, kValidate, 1);
  put_uint(hello, kMagic, 4);
  if (options_.secret.empty()) {  // torchrun's agent store: VALIDATE is all it asks
    return send_bytes(hello, /*eof_ok=*/true);
  }
  // Note [Store authentication].
  const std::string client_nonce = auth::random_bytes(auth::kNonceBytes);
  put_uint(hello, kAuth, 1);
  hello += client_nonce;
  if (!send_bytes(hello, /*eof_ok=*/true)) return false;
  std::string challenge(auth::kNonceBytes + auth::kProofBytes, '\0');
  if (!recv_bytes(challenge.data(), challenge.size(), /*eof_ok=*/true)) return false;
  const std::string server_nonce = challenge.substr(0, auth::kNonceBytes);
  if (!auth::same_bytes(challenge.substr(auth::kNonceBytes),
                        auth::server_proof(options_.secret, client_nonce, server_nonce))) {
    ::close(fd_);
    fd_ = -1;
    FSDP_USER_FAIL("rendezvous: the store at ", address(), " did not prove that it knows this "
                   "job's secret: FSDP_STORE_SECRET (or FSDP_STORE_SECRET_FILE) differs from "
                   "that of its host, or another program listens on that port");
  }
  if (!send_bytes(auth::client_proof(options_.secret, server_nonce, client_nonce), true))
    return false;
  char verdict = 0;
  if (!recv_bytes(&verdict, 1, /*eof_ok=*/true)) return false;
  if (static_cast<uint8_t>(verdict) != kAdmitted) {
    ::close(fd_);
    fd_ = -1;
    FSDP_USER_FAIL("rendezvous: the store at ", address(), " refused this process's secret "
                   "(FSDP_STORE_SECRET or FSDP_STORE_SECRET_FILE must be the same for every "
                   "rank of the job)");
  }
  return true;
}

TcpStore::~TcpStore() {
  if (fd_ < 0) return;
  if (notice_armed_) {  // a goodbye: this process ends (or drops its client) as planned
    std::string msg;
    put_uint(msg, kDisconnectNotice, 1);
    for (int i = 0; i < 3; ++i) put_string(msg, "");
    [[maybe_unused]] ssize_t n = ::send(fd_, msg.data(), msg.size(), MSG_NOSIGNAL);
  }
  ::close(fd_);
}

void TcpStore::set_disconnect_notice(const std::string& count_key, const std::string& key,
                                     const std::string& text) {
  FSDP_CHECK(!text.empty(), "a disconnect notice needs a text");
  std::string msg;
  put_uint(msg, kDisconnectNotice, 1);
  put_string(msg, count_key);
  put_string(msg, key);
  put_string(msg, text);
  std::lock_guard<std::mutex> lock(mu_);
  send_bytes(msg);
  notice_armed_ = true;
}

std::string TcpStore::address() const {
  const bool v6 = options_.host.find(':') != std::string::npos;
  return (v6 ? "[" + options_.host + "]" : options_.host) + ":" + std::to_string(options_.port);
}

void TcpStore::lost(const std::string& why) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  FSDP_USER_FAIL("rendezvous: lost the connection to the store at ", address(), ": ", why);
}

bool TcpStore::send_bytes(const std::string& bytes, bool eof_ok) {
  if (fd_ < 0) lost("it failed earlier");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && eof_ok && (errno == ECONNRESET || errno == EPIPE)) return false;
    if (n <= 0) lost(std::string(std::strerror(errno)) + " (did the process hosting it end?)");
    done += static_cast<size_t>(n);
  }
  return true;
}

bool TcpStore::recv_bytes(char* out, size_t n, bool eof_ok) {
  const auto deadline = Clock::now() + options_.timeout;
  size_t done = 0;
  while (done < n) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) lost("no reply within " + seconds_text(options_.timeout));
    const ssize_t got = ::recv(fd_, out + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (eof_ok && (got == 0 || (got < 0 && (errno == ECONNRESET || errno == EPIPE)))) return false;
    if (got == 0) lost("the store closed the connection (did the process hosting it end?)");
    if (got < 0) lost(std::strerror(errno));
    done += static_cast<size_t>(got);
  }
  return true;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  FSDP_USER_CHECK(key.size() <= kMaxKeyBytes && value.size() <= kDefaultMaxValueBytes,
                  "rendezvous: the store takes keys of at most ", kMaxKeyBytes,
                  " bytes and values of at most ", kDefaultMaxValueBytes, "; key '",
                  key.substr(0, 100), "' has ", key.size(), " and its value ", value.size());
  std::string msg;
  put_uint(msg, kSet, 1);
  put_string(msg, key);
  put_string(msg, value);
  std::lock_guard<std::mutex> lock(mu_);
  send_bytes(msg);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string msg;
  put_uint(msg, kAdd, 1);
  put_string(msg, key);
  put_uint(msg, static_cast<uint64_t>(delta), 8);
  std::lock_guard<std::mutex> lock(mu_);
  send_bytes(msg);
  char reply[8];
  recv_bytes(reply, 8);
  return static_cast<int64_t>(get_uint(reply, 8));
}

std::vector<bool> TcpStore::check(const std::vector<std::string>& keys) {
  // CHECK answers for all of its keys together: one request per key, sent back to back.
  std::string msg;
  for (const std::string& key : keys) {
    put_uint(msg, kCheck, 1);
    put_uint(msg, 1, 8);
    put_string(msg, key);
  }
  std::lock_guard<std::mutex> lock(mu_);
  send_bytes(msg);
  std::string replies(keys.size(), '\0');
  recv_bytes(replies.data(), replies.size());
  std::vector<bool> present;
  for (char c : replies) present.push_back(static_cast<uint8_t>(c) == kReady);
  return present;
}

std::string TcpStore::get(const std::string& key, Millis timeout) {
  const auto deadline = Clock::now() + timeout;
  Millis pause(1);
  while (!check({key})[0]) {
    if (Clock::now() >= deadline)
      FSDP_USER_FAIL("rendezvous: key '", key, "' was not set within ", seconds_text(timeout),
                " (store at ", address(), ")");
    std::this_thread::sleep_for(std::min<Millis>(pause, Millis(remaining_ms(deadline))));
    pause = std::min(pause * 2, Millis(50));
  }
  std::string msg;
  put_uint(msg, kGet, 1);
  put_string(msg, key);
  std::lock_guard<std::mutex> lock(mu_);
  send_bytes(msg);
  char size[8];
  recv_bytes(size, 8);
  const uint64_t n = get_uint(size, 8);
  if (n > kMaxValueBytes) lost("a reply of " + std::to_string(n) + " bytes (not a store?)");
  std::string value(n, '\0');
  recv_bytes(value.data(), n);
  return value;
}

HostedStore host_or_join_tcp_store(bool host, const std::string& addr, int port, Millis timeout,
                                   const std::string& secret, const std::string& bind_address) {
  HostedStore h;
  if (host) {
    TcpStoreServerOptions o;
    o.bind_address = bind_address;
    o.port = port;
    o.secret = secret;
    h.server = std::make_unique<TcpStoreServer>(o);
    port = h.server->port();
  }
  h.store = std::make_shared<TcpStore>(
      TcpStoreOptions{host ? h.server->connect_host() : addr, port, timeout, secret});
  return h;
}

}  // namespace fsdp::rendezvous
