// Note [TCP store protocol]
// The server and the client speak a subset of PyTorch's TCPStore wire format, so the same
// client joins the store that torchrun's agent hosts on MASTER_PORT
// (TORCHELASTIC_USE_AGENT_STORE=True) as well as our own server. Integers are little-endian;
// a string is its length (uint64) and its bytes. A connection opens with
//   VALIDATE (byte 0), uint32 0x3C85F7CE
// then, to our server, the handshake of Note [Store authentication] (AUTH, 0x71: ours
// alone, never sent to torchrun's agent store), and then carries requests, each a command
// byte and its arguments:
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
//
// Note [Store limits]
// Whoever can reach the port can connect, so what one connection can cost is bounded:
//  - Before admission (Note [Store authentication]) a client holds a few dozen bytes of
//    input, and at most limits.max_unauthenticated such connections are kept (a newcomer
//    past that drops the oldest); each is dropped if not admitted within auth_timeout.
//  - At most max_connections in all; past that, and whenever the process is out of file
//    descriptors (EMFILE), a newcomer is accepted and closed at once (the reserve descriptor
//    makes room to accept it), so a full backlog never leaves poll() spinning on the listener.
//  - A value is at most max_value_bytes. A client that does not read its replies is served
//    nothing more, and read no further, while max_pending_reply_bytes of them wait.
//  - Input is consumed by offset and compacted once per read, so parsing is linear in the
//    bytes received however many requests they hold; each connection is read at most
//    kReadBudget bytes per round, so one fast sender cannot starve the others.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "fsdp/error.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/tcp_store_connection.h"
#include "rendezvous/tcp_store_wire.h"

namespace fsdp::rendezvous {

using server::Clock;
using server::Connection;

struct TcpStoreServer::Counters {
  std::atomic<uint64_t> polls{0}, accepted{0}, admitted{0}, refused_secrets{0},
      dropped_unadmitted{0}, turned_away{0}, requests{0}, input_bytes{0}, input_bytes_moved{0},
      peak_pending_reply_bytes{0}, open_connections{0};
};

namespace {

constexpr size_t kReadBudget = 1 << 20;   // per connection and round
constexpr size_t kPreAdmissionRead = 256;  // more than any handshake message
constexpr int kAcceptsPerRound = 64;

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// A listening socket on `bind` ("*": every interface, IPv6 with IPv4 mapped, else IPv4).
int listen_on(const std::string& bind, int port, std::string& error) {
  std::vector<sockaddr_storage> addrs;
  std::vector<socklen_t> lens;
  if (bind == "*") {
    sockaddr_storage ss{};
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&ss);
    a6->sin6_family = AF_INET6;
    a6->sin6_addr = in6addr_any;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    addrs.push_back(ss);
    lens.push_back(sizeof(sockaddr_in6));
    ss = {};
    auto* a4 = reinterpret_cast<sockaddr_in*>(&ss);
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    a4->sin_port = htons(static_cast<uint16_t>(port));
    addrs.push_back(ss);
    lens.push_back(sizeof(sockaddr_in));
  } else {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    const int rc = ::getaddrinfo(bind.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      error = std::string("cannot resolve it: ") + ::gai_strerror(rc);
      return -1;
    }
    // IPv4 first (what the ranks' Gloo connections use too), then IPv6.
    for (int family : {AF_INET, AF_INET6})
      for (addrinfo* ai = res; ai; ai = ai->ai_next)
        if (ai->ai_family == family) {
          sockaddr_storage ss{};
          std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
          addrs.push_back(ss);
          lens.push_back(ai->ai_addrlen);
        }
    ::freeaddrinfo(res);
  }
  for (size_t i = 0; i < addrs.size(); ++i) {
    const int family = addrs[i].ss_family;
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (family == AF_INET6 && bind == "*")
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addrs[i]), lens[i]) == 0 && ::listen(fd, 1024) == 0)
      return fd;
    error = std::strerror(errno);
    ::close(fd);
    if (error.find("in use") != std::string::npos) break;  // another family would say the same
  }
  if (addrs.empty()) error = "it has no address";
  return -1;
}

void bound_address(int fd, int& port, std::string& text) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    port = ntohs(a->sin6_port);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
  } else {
    const auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    port = ntohs(a->sin_port);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
  }
  text = buf;
}

void raise_to(std::atomic<uint64_t>& peak, uint64_t v) {
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (v > seen && !peak.compare_exchange_weak(seen, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

TcpStoreServer::TcpStoreServer(const TcpStoreServerOptions& options)
    : options_(options), counters_(std::make_shared<Counters>()) {
  const TcpStoreLimits& l = options.limits;
  FSDP_CHECK(options.port >= 0 && options.port <= 65535, "a TCP port is in [0, 65535], got ",
             options.port);
  FSDP_CHECK(options.open || !options.secret.empty(),
             "the store's server needs the job's secret (Note [Store authentication])");
  FSDP_CHECK(l.max_value_bytes <= wire::kMaxValueBytes && l.max_pending_reply_bytes > 0 &&
                 l.max_connections > 0 && l.max_unauthenticated > 0 && l.auth_timeout.count() > 0,
             "bad store limits");
  std::string error = "unknown error";
  listen_fd_ = listen_on(options.bind_address, options.port, error);
  if (listen_fd_ < 0) {
    const bool in_use = error.find("in use") != std::string::npos;
    const bool not_here = error.find("assign requested address") != std::string::npos;
    const char* hint = in_use && options.port != 0
                           ? " (is another job using it? pick another --master-port)"
                       : not_here ? " (it is not an address of this host: --master-addr names "
                                    "the host of node 0 or rank 0, where the store listens)"
                                  : "";
    FSDP_USER_FAIL("rendezvous: cannot host the store on port ", options.port, " of ",
                   options.bind_address == "*" ? "every interface" : options.bind_address, ": ",
                   error, hint);
  }
  bound_address(listen_fd_, port_, listen_address_);
  connect_host_ = listen_address_ == "0.0.0.0" || listen_address_ == "::" ? "127.0.0.1"
                                                                          : listen_address_;
  set_nonblocking(listen_fd_);
  FSDP_CHECK(::pipe2(wake_pipe_, O_CLOEXEC) == 0, "pipe failed: ", std::strerror(errno));
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (options.start) start();
}

TcpStoreServer::~TcpStoreServer() { stop(); }

void TcpStoreServer::start() {
  FSDP_CHECK(!thread_.joinable() && listen_fd_ >= 0, "the store server was already started");
  thread_ = std::thread([this] { serve(); });
}

void TcpStoreServer::close_in_child() {
  for (int* fd : {&listen_fd_, &wake_pipe_[0], &wake_pipe_[1], &reserve_fd_}) {
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

TcpStoreServer::Stats TcpStoreServer::stats() const {
  const Counters& c = *counters_;
  Stats s;
  s.polls = c.polls.load();
  s.accepted = c.accepted.load();
  s.admitted = c.admitted.load();
  s.refused_secrets = c.refused_secrets.load();
  s.dropped_unadmitted = c.dropped_unadmitted.load();
  s.turned_away = c.turned_away.load();
  s.requests = c.requests.load();
  s.input_bytes = c.input_bytes.load();
  s.input_bytes_moved = c.input_bytes_moved.load();
  s.peak_pending_reply_bytes = c.peak_pending_reply_bytes.load();
  s.open_connections = c.open_connections.load();
  return s;
}

void TcpStoreServer::serve() {
  const TcpStoreLimits& limits = options_.limits;
  const server::ServePolicy policy{options_.secret, options_.open, limits,
                                   limits.max_value_bytes + 3 * wire::kMaxKeyBytes + 64};
  Counters& counters = *counters_;
  server::KeyValues kv;
  std::vector<std::unique_ptr<Connection>> conns;  // in accept order
  std::vector<pollfd> fds;
  int live = 0, unadmitted = 0;      // connections not closed; of them, not yet admitted
  Clock::time_point listen_again{};  // the listener is left out of poll() until then

  auto close_connection = [&](Connection& c) {
    if (c.fd >= 0) {
      ::close(c.fd);
      --live;
      if (!c.admitted()) --unadmitted;
    }
    c.fd = -1;
    c.closed = true;
  };
  // Counted before the close: a peer that sees its connection end sees the count.
  auto drop_unadmitted = [&](Connection& c) {
    ++counters.dropped_unadmitted;
    close_connection(c);
  };
  // Closes the oldest connection not yet admitted, to make room; false if there is none.
  auto evict_oldest_unadmitted = [&] {
    for (auto& c : conns)
      if (c->fd >= 0 && !c->admitted()) {
        if (c->closed) close_connection(*c);  // closing anyway
        else drop_unadmitted(*c);
        return true;
      }
    return false;
  };
  auto reopen_reserve = [&] { reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC); };
  auto accept_some = [&](Clock::time_point now) {
    for (int n = 0; n < kAcceptsPerRound; ++n) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if ((errno != EMFILE && errno != ENFILE) || reserve_fd_ < 0) {
          listen_again = now + std::chrono::milliseconds(100);  // no memory, or no reserve fd
          return;
        }
        // Out of fds (which says nothing of whether anyone waits): the reserve one takes the
        // newcomer, if there is one; then the oldest not yet admitted makes room for it, or
        // it is turned away.
        ::close(reserve_fd_);
        fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          reopen_reserve();
          return;
        }
        if (!evict_oldest_unadmitted()) {
          ++counters.turned_away;  // before the close, as drop_unadmitted counts
          ::close(fd);
          reopen_reserve();
          continue;
        }
        reopen_reserve();
      }
      if (unadmitted >= limits.max_unauthenticated) {
        evict_oldest_unadmitted();
      } else if (live >= limits.max_connections && !evict_oldest_unadmitted()) {
        ++counters.turned_away;
        ::close(fd);  // every place is taken by an admitted client
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Connection>();
      c->fd = fd;
      c->auth_deadline = now + limits.auth_timeout;
      conns.push_back(std::move(c));
      ++live;
      ++unadmitted;
      ++counters.accepted;
    }
  };
  // Reads what has come (up to the round's budget); false when the peer is gone.
  auto read_some = [&](Connection& c) {
    char buf[65536];
    size_t budget = c.admitted() ? kReadBudget : kPreAdmissionRead;
    while (budget > 0) {
      const ssize_t n = ::recv(c.fd, buf, std::min(sizeof buf, budget), 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        counters.input_bytes += static_cast<uint64_t>(n);
        budget -= static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    return true;
  };
  // Sends what is pending; false when the socket took less than all of it (or broke).
  auto write_some = [&](Connection& c) {
    while (c.pending_out() > 0) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, c.pending_out(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out_pos += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (!(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) c.closed = true;
      break;
    }
    if (c.out_pos == c.out.size()) {
      c.out.clear();
      c.out_pos = 0;
    } else if (c.out_pos > (1u << 20) && c.out_pos > c.out.size() / 2) {
      c.out.erase(0, c.out_pos);
      c.out_pos = 0;
    }
    return c.pending_out() == 0 && !c.closed;
  };
  auto serve_some = [&](Connection& c) {
    server::ServeCounts counts;
    const bool was_admitted = c.admitted();
    server::serve_requests(c, kv, policy, counts);
    if (!was_admitted && c.admitted()) --unadmitted;
    counters.requests += counts.requests;
    counters.admitted += counts.admitted;
    counters.refused_secrets += counts.refused_secrets;
    counters.dropped_unadmitted += counts.dropped_unadmitted;
    raise_to(counters.peak_pending_reply_bytes, c.pending_out());
    // Compact once per round: what is left is less than one request.
    if (c.in_pos > 0) {
      counters.input_bytes_moved += c.unparsed();
      c.in.erase(0, c.in_pos);
      c.in_pos = 0;
    }
  };

  while (!stopping_.load()) {
    Clock::time_point now = Clock::now();
    // Drop those whose handshake ran out of time, then forget the closed ones.
    for (auto& c : conns)
      if (c->fd >= 0 && !c->admitted() && c->auth_deadline <= now) drop_unadmitted(*c);
    size_t kept = 0;
    for (auto& c : conns) {
      if (c->closed) {
        if (c->admitted() && !c->notice.empty()) {
          int64_t count = 0;
          if (server::add_to(kv, c->notice_count_key, 1, count) && count == 1)
            kv[c->notice_key] = std::move(c->notice);
        }
        close_connection(*c);
        continue;
      }
      conns[kept++] = std::move(c);
    }
    conns.resize(kept);
    counters.open_connections = conns.size();

    const bool listening = now >= listen_again;
    fds.assign({{wake_pipe_[0], POLLIN, 0}, {listening ? listen_fd_ : -1, POLLIN, 0}});
    Clock::time_point wake_at = listening ? Clock::time_point::max() : listen_again;
    for (const auto& c : conns) {
      const bool reads = !c->closing && c->pending_out() < limits.max_pending_reply_bytes &&
                         c->unparsed() < policy.max_request_bytes;
      fds.push_back({c->fd, static_cast<short>((reads ? POLLIN : 0) |
                                               (c->pending_out() > 0 ? POLLOUT : 0)), 0});
      if (!c->admitted()) wake_at = std::min(wake_at, c->auth_deadline);
    }
    int timeout_ms = -1;
    if (wake_at != Clock::time_point::max()) {  // rounded up: never wake before the deadline
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    ++counters.polls;
    if (fds[0].revents) break;
    now = Clock::now();
    const size_t polled = conns.size();  // those accepted below wait for the next round
    if (fds[1].revents & POLLIN) accept_some(now);
    for (size_t i = 0; i < polled; ++i) {
      Connection& c = *conns[i];
      const short ev = fds[i + 2].revents;
      if (c.closed || ev == 0) continue;
      const bool ended = (ev & (POLLIN | POLLHUP | POLLERR)) && !read_some(c);
      // The requests that came with the end still count (a client's goodbye comes so).
      serve_some(c);
      for (int round = 0; round < 8 && !c.closed; ++round) {
        if (!write_some(c) || c.closing || c.unparsed() == 0) break;
        const size_t before = c.unparsed();
        serve_some(c);  // its replies went out: serve what waited behind them
        if (c.unparsed() == before) break;  // what is left is not a whole request yet
      }
      if (ended || (c.closing && c.pending_out() == 0)) c.closed = true;
    }
  }
  for (auto& c : conns) close_connection(*c);
}

}  // namespace fsdp::rendezvous
