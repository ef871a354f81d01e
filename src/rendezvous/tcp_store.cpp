// Note [TCP store protocol]
// The server and the client speak a subset of PyTorch's TCPStore wire format, so the same
// client joins the store that torchrun's agent hosts on MASTER_PORT
// (TORCHELASTIC_USE_AGENT_STORE=True) as well as our own server. Integers are little-endian;
// a string is its length (uint64) and its bytes. A connection opens with
//   VALIDATE (byte 0), uint32 0x3C85F7CE
// and then carries requests, each a command byte and its arguments:
//   SET   (1) key, value              no reply
//   GET   (3) key                     reply: value (empty when unset)
//   ADD   (4) key, int64 delta        reply: int64 new value (stored as its decimal text)
//   CHECK (5) uint64 n, n keys        reply: byte 0 when all are set, 1 otherwise
// The client never uses the blocking WAIT: get() polls CHECK and then GETs, so a wait that
// times out leaves no reply in flight on the connection, and the one code path works on both
// servers. A server that dies closes the connection; the waiting client's next request (at
// most 50 ms later) then fails with a message saying so.
#include "rendezvous/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "fsdp/error.h"

namespace fsdp::rendezvous {

namespace {

constexpr uint8_t kValidate = 0, kSet = 1, kGet = 3, kAdd = 4, kCheck = 5;
constexpr uint32_t kMagic = 0x3C85F7CE;
constexpr uint8_t kReady = 0, kNotReady = 1;
constexpr uint64_t kMaxKeyBytes = 1 << 20, kMaxValueBytes = 256ull << 20, kMaxKeys = 1 << 20;

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

void put_uint(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_string(std::string& out, const std::string& s) {
  put_uint(out, s.size(), 8);
  out += s;
}
uint64_t get_uint(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Reads a request from a connection's input; each read returns false when the bytes have not
// all arrived yet (the request is then parsed again once more came in).
struct Cursor {
  const std::string& in;
  size_t pos;
  bool bad = false;  // a malformed request: the server drops the connection
  bool uint(uint64_t& v, int bytes) {
    if (in.size() - pos < static_cast<size_t>(bytes)) return false;
    v = get_uint(in.data() + pos, bytes);
    pos += bytes;
    return true;
  }
  bool string(std::string& s, uint64_t limit) {
    uint64_t n = 0;
    if (!uint(n, 8)) return false;
    if (n > limit) {
      bad = true;
      return false;
    }
    if (in.size() - pos < n) return false;
    s.assign(in, pos, n);
    pos += n;
    return true;
  }
};

struct Connection {
  int fd = -1;
  bool validated = false;
  bool closed = false;
  std::string in, out;
};

// Parses and answers one request at the start of c.in; false when it is incomplete or bad.
bool serve_one(Connection& c, std::map<std::string, std::string>& kv) {
  Cursor r{c.in, 0};
  uint64_t op = 0;
  if (!r.uint(op, 1)) return false;
  if (!c.validated) {
    uint64_t magic = 0;
    if (!r.uint(magic, 4)) return false;
    if (op != kValidate || magic != kMagic) {
      c.closed = true;  // not one of ours
      return false;
    }
    c.validated = true;
  } else if (op == kSet) {
    std::string key, value;
    if (!r.string(key, kMaxKeyBytes) || !r.string(value, kMaxValueBytes)) {
      c.closed = r.bad;
      return false;
    }
    kv[key] = std::move(value);
  } else if (op == kGet) {
    std::string key;
    if (!r.string(key, kMaxKeyBytes)) {
      c.closed = r.bad;
      return false;
    }
    auto it = kv.find(key);
    put_string(c.out, it == kv.end() ? std::string() : it->second);
  } else if (op == kAdd) {
    std::string key;
    uint64_t delta = 0;
    if (!r.string(key, kMaxKeyBytes) || !r.uint(delta, 8)) {
      c.closed = r.bad;
      return false;
    }
    auto it = kv.find(key);
    int64_t now = static_cast<int64_t>(delta);
    if (it != kv.end()) {
      try {
        now += std::stoll(it->second);
      } catch (const std::exception&) {
        c.closed = true;  // ADD on a key that holds no number
        return false;
      }
    }
    kv[key] = std::to_string(now);
    put_uint(c.out, static_cast<uint64_t>(now), 8);
  } else if (op == kCheck) {
    uint64_t n = 0;
    if (!r.uint(n, 8)) return false;
    if (n > kMaxKeys) {
      c.closed = true;
      return false;
    }
    bool all = true;
    for (uint64_t i = 0; i < n; ++i) {
      std::string key;
      if (!r.string(key, kMaxKeyBytes)) {
        c.closed = r.bad;
        return false;
      }
      all = all && kv.count(key) > 0;
    }
    c.out.push_back(static_cast<char>(all ? kReady : kNotReady));
  } else {
    c.closed = true;  // a command this server does not implement
    return false;
  }
  c.in.erase(0, r.pos);
  return true;
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// A listening socket on every interface (IPv6 with IPv4 mapped, else IPv4 alone).
int listen_on(int port, std::string& error) {
  for (int family : {AF_INET6, AF_INET}) {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage ss{};
    socklen_t len;
    if (family == AF_INET6) {
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a;
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 && ::listen(fd, 1024) == 0)
      return fd;
    error = std::strerror(errno);
    ::close(fd);
    if (error.find("in use") != std::string::npos) break;  // IPv4 would say the same
  }
  return -1;
}

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
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

// ---- server

TcpStoreServer::TcpStoreServer(int port, bool start_now) {
  FSDP_CHECK(port >= 0 && port <= 65535, "a TCP port is in [0, 65535], got ", port);
  std::string error = "unknown error";
  listen_fd_ = listen_on(port, error);
  if (listen_fd_ < 0)
    FSDP_USER_FAIL("rendezvous: cannot host the store on port ", port, ": ", error,
              port == 0 ? "" : " (is another job using it? pick another --master-port)");
  port_ = bound_port(listen_fd_);
  set_nonblocking(listen_fd_);
  FSDP_CHECK(::pipe2(wake_pipe_, O_CLOEXEC) == 0, "pipe failed: ", std::strerror(errno));
  if (start_now) start();
}

TcpStoreServer::~TcpStoreServer() { stop(); }

void TcpStoreServer::start() {
  FSDP_CHECK(!thread_.joinable() && listen_fd_ >= 0, "the store server was already started");
  thread_ = std::thread([this] { serve(); });
}

void TcpStoreServer::close_in_child() {
  for (int* fd : {&listen_fd_, &wake_pipe_[0], &wake_pipe_[1]}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void TcpStoreServer::stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) {
    const char byte = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_pipe_[1], &byte, 1);
    thread_.join();
  }
  close_in_child();
}

void TcpStoreServer::serve() {
  std::map<std::string, std::string> kv;
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    fds.assign({{wake_pipe_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const Connection& c : conns)
      fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents) break;
    if (fds[1].revents & POLLIN) {
      for (int fd; (fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        Connection c;
        c.fd = fd;
        conns.push_back(std::move(c));
      }
    }
    for (size_t i = 0; i + 2 < fds.size(); ++i) {
      Connection& c = conns[i];
      if (fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[65536];
        for (;;) {
          const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
          if (n > 0) {
            c.in.append(buf, static_cast<size_t>(n));
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.closed = true;
          if (n < 0 && errno == EINTR) continue;
          break;
        }
        while (!c.closed && serve_one(c, kv)) {
        }
      }
      while (!c.closed && !c.out.empty()) {
        const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
        if (n > 0) {
          c.out.erase(0, static_cast<size_t>(n));
        } else {
          if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c.closed = true;
          if (n < 0 && errno == EINTR) continue;
          break;
        }
      }
    }
    for (size_t i = conns.size(); i-- > 0;) {
      if (!conns[i].closed) continue;
      ::close(conns[i].fd);
      conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  for (const Connection& c : conns) ::close(c.fd);
}

// ---- client

TcpStore::TcpStore(const TcpStoreOptions& options) : options_(options) {
  FSDP_CHECK(options.port > 0 && options.port <= 65535,
             "the store's port must be in [1, 65535], got ", options.port);
  const auto start = Clock::now();
  const auto deadline = start + options.timeout;
  std::string error = "timed out";
  Millis pause(10);
  for (;;) {
    fd_ = try_connect(options.host, options.port, std::min(remaining_ms(deadline), 5000), error);
    if (fd_ >= 0 || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::min<Millis>(pause, Millis(remaining_ms(deadline))));
    pause = std::min(pause * 2, Millis(500));
  }
  if (fd_ < 0)
    FSDP_USER_FAIL("rendezvous: could not connect to the store at ", address(), " (tried for ",
              seconds_text(std::chrono::duration_cast<Millis>(Clock::now() - start)),
              "; last error: ", error,
              "); is the process that hosts it (rank 0) running, and are the address and "
              "port right?");
  std::string hello;
  put_uint(hello, kValidate, 1);
  put_uint(hello, kMagic, 4);
  send_bytes(hello);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
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

void TcpStore::send_bytes(const std::string& bytes) {
  if (fd_ < 0) lost("it failed earlier");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) lost(std::string(std::strerror(errno)) + " (did the process hosting it end?)");
    done += static_cast<size_t>(n);
  }
}

void TcpStore::recv_bytes(char* out, size_t n) {
  const auto deadline = Clock::now() + options_.timeout;
  size_t done = 0;
  while (done < n) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, remaining_ms(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) lost("no reply within " + seconds_text(options_.timeout));
    const ssize_t got = ::recv(fd_, out + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got == 0) lost("the store closed the connection (did the process hosting it end?)");
    if (got < 0) lost(std::strerror(errno));
    done += static_cast<size_t>(got);
  }
}

void TcpStore::set(const std::string& key, const std::string& value) {
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

HostedStore host_or_join_tcp_store(bool host, const std::string& addr, int port, Millis timeout) {
  HostedStore h;
  if (host) {
    h.server = std::make_unique<TcpStoreServer>(port);
    port = h.server->port();
  }
  h.store = std::make_shared<TcpStore>(TcpStoreOptions{host ? "127.0.0.1" : addr, port, timeout});
  return h;
}

}  // namespace fsdp::rendezvous
