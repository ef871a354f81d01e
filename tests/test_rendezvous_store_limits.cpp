// Note [Store limits]: what one client can cost the store's server is bounded, and the
// server keeps serving a real rank throughout. Small limits are injected where a default
// would only make a test slow; the bounds are counts the server keeps (Stats), not times.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "fsdp/error.h"
#include "rendezvous/tcp_store.h"
#include "store_test_util.h"

namespace fsdp::rendezvous {
namespace {

using namespace store_test;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A client that sends 128 GETs of a large value and reads none of the replies: the server
// holds at most the limit (and one reply) of them at a time, serves a rank meanwhile, and
// sends every reply, whole, once the client reads.
TEST(StoreLimits, AClientThatDoesNotReadIsServedNoFurther) {
  TcpStoreServerOptions o = test_server();
  o.limits.max_value_bytes = 256 << 10;
  o.limits.max_pending_reply_bytes = 1 << 20;
  TcpStoreServer server(o);
  TcpStore rank(local(server.port()));
  std::string value(o.limits.max_value_bytes, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 7 + i / 251);
  rank.set("big", value);
  const int greedy = admitted_socket(server.port());
  ASSERT_GE(greedy, 0);
  std::string gets;
  for (int i = 0; i < 128; ++i) gets += request('\x03', {"big"});  // GET
  ASSERT_TRUE(write_all(greedy, gets));
  // Until it is held back: its unread replies reached the limit.
  ASSERT_TRUE(eventually([&] {
    return server.stats().peak_pending_reply_bytes >= o.limits.max_pending_reply_bytes;
  }));
  EXPECT_EQ(rank.get("big", kLong), value);  // the rank is served meanwhile
  rank.set("small", "x");
  EXPECT_EQ(rank.add("n", 2), 2);
  // The bound: under the limit when the last GET was served, plus that GET's reply.
  EXPECT_LT(server.stats().peak_pending_reply_bytes,
            o.limits.max_pending_reply_bytes + 8 + value.size());
  const std::string reply = le64(value.size()) + value;
  for (int i = 0; i < 128; ++i) ASSERT_EQ(read_up_to(greedy, reply.size()), reply) << i;
  ::close(greedy);
  EXPECT_LT(server.stats().peak_pending_reply_bytes,
            o.limits.max_pending_reply_bytes + 8 + value.size());
}

// A SET whose value is over the limit closes its connection on its length alone (the server
// does not wait for the bytes); a client is told before it sends one.
TEST(StoreLimits, AValueOverTheLimitClosesItsConnection) {
  TcpStoreServerOptions o = test_server();
  o.limits.max_value_bytes = 1000;
  TcpStoreServer server(o);
  const int fd = admitted_socket(server.port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(write_all(fd, request('\x01', {"k"}) + le64(1001)));  // SET, a value too long
  EXPECT_TRUE(closed_by_peer(fd));
  ::close(fd);
  TcpStore rank(local(server.port()));
  EXPECT_EQ(rank.check({"k"}), std::vector<bool>{false});
  rank.set("k", std::string(1000, 'v'));
  EXPECT_EQ(rank.get("k", kLong).size(), 1000u);
  const std::string e = error_of([&] { rank.set("k", std::string((16 << 20) + 1, 'v')); });
  EXPECT_NE(e.find("values of at most 16777216; key 'k' has 1 and its value 16777217"),
            std::string::npos) << e;
}

// 50,000 SETs in one stream: the server parses them in time linear in the bytes (each read's
// leftover is moved once, not the whole buffer once per request), and all are kept.
TEST(StoreLimits, PipelinedRequestsAreParsedInLinearTime) {
  TcpStoreServer server(test_server());
  const int fd = admitted_socket(server.port());
  ASSERT_GE(fd, 0);
  constexpr int kSets = 50000;
  auto key = [](int i) {
    std::string k = "k";
    return k += std::to_string(i);
  };
  std::string stream;
  for (int i = 0; i < kSets; ++i) stream += request('\x01', {key(i), "v"});  // SET
  // CHECK of the last key: the one reply, after every SET.
  stream += request('\x05', {});
  stream += le64(1);
  stream += str(key(kSets - 1));
  const uint64_t before = server.stats().input_bytes;
  std::thread writer([&] { write_all(fd, stream); });
  TcpStore rank(local(server.port()));  // served while the stream comes in
  rank.set("rank", "here");
  EXPECT_EQ(read_up_to(fd, 1), std::string(1, '\0'));  // READY: every SET before it was served
  writer.join();
  ::close(fd);
  const TcpStoreServer::Stats s = server.stats();
  EXPECT_GE(s.input_bytes - before, stream.size());
  // Linear: what the compactions moved is at most what came in (each moves less than one
  // request); per-request erasing moves gigabytes here.
  EXPECT_LE(s.input_bytes_moved, s.input_bytes);
  EXPECT_EQ(rank.get("k0", kLong), "v");
  EXPECT_EQ(rank.get(key(kSets - 1), kLong), "v");
  EXPECT_EQ(rank.get("rank", kLong), "here");
}

// 100 connections that never authenticate: past max_unauthenticated the oldest of them are
// dropped, so they hold few places, and a rank that comes after them is admitted and served.
TEST(StoreLimits, IdleStrangersCannotCrowdOutARank) {
  TcpStoreServerOptions o = test_server();
  o.limits.max_unauthenticated = 8;
  o.limits.max_connections = 16;
  o.limits.auth_timeout = kLong;  // none is dropped for its time here
  TcpStoreServer server(o);
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(connect_loopback(server.port()));
  for (int fd : idle) ASSERT_GE(fd, 0);
  ASSERT_TRUE(eventually([&] { return server.stats().accepted == 100; }));
  ASSERT_EQ(server.stats().dropped_unadmitted, 100u - 8u);
  TcpStore rank(local(server.port()));
  rank.set("k", "v");
  EXPECT_EQ(rank.get("k", kLong), "v");
  const TcpStoreServer::Stats s = server.stats();
  EXPECT_LE(s.open_connections, 8u + 1u);
  EXPECT_EQ(s.admitted, 1u);
  // The dropped ones, the oldest (one more made room for the rank), see their connection end.
  for (int i = 0; i < 100 - 8 + 1; ++i) EXPECT_TRUE(closed_by_peer(idle[i])) << i;
  for (int fd : idle) ::close(fd);
}

// A file descriptor that the test closes to end a forked child's wait.
struct Pipe {
  int fds[2] = {-1, -1};
  Pipe() { FSDP_CHECK(::pipe(fds) == 0, "pipe"); }
  ~Pipe() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
  }
};

// The server in a child process with only a few file descriptors left: 100 strangers, then
// ranks enough to take every descriptor. The server never spins (each poll() handled an
// event), drops strangers to admit a rank, turns a newcomer away while every descriptor is
// an admitted rank's, and admits it once one leaves.
TEST(StoreLimits, OutOfFileDescriptorsTheServerNeitherSpinsNorStops) {
  Pipe port_pipe, stats_pipe, done_pipe;
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = ::fork();
  if (child == 0) {
    TcpStoreServerOptions o = test_server();
    o.limits.auth_timeout = kLong;  // none is dropped for its time here
    TcpStoreServer server(o);
    // 6 descriptors above those open now (fds are handed out lowest first).
    const int lowest_free = ::dup(0);
    ::close(lowest_free);
    rlimit r{};
    ::getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = static_cast<rlim_t>(lowest_free + 6);
    const int port = server.port();
    if (::setrlimit(RLIMIT_NOFILE, &r) != 0 ||
        ::write(port_pipe.fds[1], &port, sizeof port) != sizeof port)
      std::_Exit(2);
    char go = 0;
    if (::read(done_pipe.fds[0], &go, 1) != 1) std::_Exit(3);  // the test asks for the counts
    const TcpStoreServer::Stats s = server.stats();
    if (::write(stats_pipe.fds[1], &s, sizeof s) != sizeof s) std::_Exit(4);
    std::_Exit(0);
  }
  ASSERT_GT(child, 0);
  struct KillOnFailure {  // a failed assertion below must not leave the child behind
    pid_t pid;
    ~KillOnFailure() {
      if (pid <= 0) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } guard{child};
  int port = 0;
  ASSERT_EQ(::read(port_pipe.fds[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(connect_loopback(port));
  {
    TcpStore rank(local(port));  // strangers give way to it
    rank.set("k", "v");
    EXPECT_EQ(rank.get("k", kLong), "v");
    // Five more ranks: with the first, every descriptor the server has.
    std::vector<std::unique_ptr<TcpStore>> more;
    for (int i = 0; i < 5; ++i) more.push_back(std::make_unique<TcpStore>(local(port)));
    // Not admitted while every place is taken (turned away: the counts below say so).
    const std::string e = error_of([&] { TcpStore late(local(port, Millis(200))); });
    EXPECT_TRUE(e.find("closed the connection before admitting this client") != std::string::npos ||
                e.find("no reply within 0.2 s") != std::string::npos)
        << e;
    more.pop_back();  // a place frees up
    TcpStore late(local(port));
    EXPECT_EQ(late.add("n", 1), 1);
  }
  for (int fd : idle) ::close(fd);
  ASSERT_EQ(::write(done_pipe.fds[1], "x", 1), 1);
  TcpStoreServer::Stats s;
  ASSERT_EQ(::read(stats_pipe.fds[0], &s, sizeof s), static_cast<ssize_t>(sizeof s));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  guard.pid = 0;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_GE(s.turned_away, 1u);
  EXPECT_EQ(s.admitted, 7u);
  EXPECT_GE(s.dropped_unadmitted, 100u - 6u);
  // No spinning: every poll() returned for something to do (a newcomer, bytes, a closed
  // connection, a deadline), so they are bounded by those events.
  const uint64_t events = s.accepted + s.turned_away + 4 * s.admitted + s.requests;
  EXPECT_LE(s.polls, 4 * events + 32) << "accepted " << s.accepted << ", turned away "
                                      << s.turned_away << ", requests " << s.requests;
}

}  // namespace
}  // namespace fsdp::rendezvous
