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
// and one command of ours alone (so never sent to torchrun's agent store):
//   DISCONNECT_NOTICE (0x70) count key, notice key, text     no reply
// which arms (an empty text disarms) this connection's notice: should the connection close
// while armed (its process died without destroying its client), the server adds 1 to the
// count key and, if that made it 1, sets the notice key to the text (Note [Failure notices]).
// The client never uses the blocking WAIT: get() polls CHECK and then GETs, so a wait that
// times out leaves no reply in flight on the connection, and the one code path works on both
// servers. A server that dies closes the connection; the waiting client's next request (at
// most 50 ms later) then fails with a message saying so.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <vector>

#include "fsdp/error.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/tcp_store_wire.h"

namespace fsdp::rendezvous {

using namespace wire;

namespace {

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
  std::string notice_count_key, notice_key, notice;  // armed while notice is not empty
};

// ADD: the key's new value, or nullopt when it holds no number.
std::optional<int64_t> add_to(std::map<std::string, std::string>& kv, const std::string& key,
                              int64_t delta) {
  auto it = kv.find(key);
  int64_t now = delta;
  if (it != kv.end()) {
    try {
      now += std::stoll(it->second);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  kv[key] = std::to_string(now);
  return now;
}

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
    const std::optional<int64_t> now = add_to(kv, key, static_cast<int64_t>(delta));
    if (!now) {
      c.closed = true;  // ADD on a key that holds no number
      return false;
    }
    put_uint(c.out, static_cast<uint64_t>(*now), 8);
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
  } else if (op == kDisconnectNotice) {
    std::string count_key, key, text;
    if (!r.string(count_key, kMaxKeyBytes) || !r.string(key, kMaxKeyBytes) ||
        !r.string(text, kMaxValueBytes)) {
      c.closed = r.bad;
      return false;
    }
    c.notice_count_key = std::move(count_key);
    c.notice_key = std::move(key);
    c.notice = std::move(text);
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

}  // namespace

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
        bool ended = false;
        for (;;) {
          const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
          if (n > 0) {
            c.in.append(buf, static_cast<size_t>(n));
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) ended = true;
          if (n < 0 && errno == EINTR) continue;
          break;
        }
        // The requests that came with the end still count (a client's goodbye comes so).
        while (!c.closed && serve_one(c, kv)) {
        }
        if (ended) c.closed = true;
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
      Connection& c = conns[i];
      if (!c.closed) continue;
      if (!c.notice.empty() && add_to(kv, c.notice_count_key, 1) == 1)
        kv[c.notice_key] = std::move(c.notice);
      ::close(c.fd);
      conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  for (const Connection& c : conns) ::close(c.fd);
}

}  // namespace fsdp::rendezvous
