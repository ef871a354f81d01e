// The TCP rendezvous store: ranks as threads and as forked processes meet through it; every
// failure (a timeout, a refused connection, a store whose process died) ends in a message
// that names what was missing, and never in a hang.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
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

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Runs `body` in a forked child; the child's exit code is 0 when it returned, 1 when it threw.
pid_t fork_child(const std::function<void()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
      code = 1;
    }
    std::_Exit(code);
  }
  return pid;
}

int exit_code(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(TcpStore, SetGetAddAndCheck) {
  TcpStoreServer server(test_server());
  TcpStore store(local(server.port()));
  const std::string binary("a\0b\xff", 4);
  store.set("bytes", binary);
  store.set("empty", "");
  EXPECT_EQ(store.get("bytes", kLong), binary);
  EXPECT_EQ(store.get("empty", kLong), "");
  EXPECT_EQ(store.add("n", 3), 3);
  EXPECT_EQ(store.add("n", -5), -2);
  EXPECT_EQ(store.get("n", kLong), "-2");
  EXPECT_EQ(store.check({"bytes", "missing", "n", "empty"}),
            (std::vector<bool>{true, false, true, true}));
  store.set("bytes", "replaced");
  EXPECT_EQ(store.get("bytes", kLong), "replaced");
}

TEST(TcpStore, PortZeroPicksAFreePort) {
  TcpStoreServer a(test_server()), b(test_server());
  EXPECT_GT(a.port(), 0);
  EXPECT_GT(b.port(), 0);
  EXPECT_NE(a.port(), b.port());
}

TEST(TcpStore, ATakenPortIsRefusedNamingIt) {
  TcpStoreServer a(test_server());
  const std::string e = error_of([&] { TcpStoreServer b(test_server(a.port())); });
  EXPECT_TRUE(contains(e, "cannot host the store on port " + std::to_string(a.port())) &&
              contains(e, "in use"))
      << e;
}

TEST(TcpStore, ClientsOfOneServerShareTheKeys) {
  TcpStoreServer server(test_server());
  TcpStore a(local(server.port())), b(local(server.port()));
  a.set("k", "from a");
  EXPECT_EQ(b.get("k", kLong), "from a");
  EXPECT_EQ(a.add("c", 1), 1);
  EXPECT_EQ(b.add("c", 1), 2);
  PrefixStore pa("job1", std::shared_ptr<Store>(&a, [](Store*) {}));
  pa.set("k", "scoped");
  EXPECT_EQ(b.get("job1/k", kLong), "scoped");
  EXPECT_EQ(a.get("k", kLong), "from a");
}

TEST(TcpStore, RankThreadsMeetAtABarrierAndExchangeValues) {
  constexpr int kWorld = 4;
  TcpStoreServer server(test_server());
  std::vector<std::string> seen(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r)
    ranks.emplace_back([&, r] {
      TcpStore store(local(server.port()));
      store.set("value/" + std::to_string(r), "rank" + std::to_string(r));
      store.barrier("exchange", r, kWorld, kLong);
      for (int peer = 0; peer < kWorld; ++peer)
        seen[r] += store.get("value/" + std::to_string(peer), kLong) + ";";
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(seen[r], "rank0;rank1;rank2;rank3;");
}

TEST(TcpStore, RankProcessesMeetAtABarrierAndExchangeValues) {
  constexpr int kWorld = 4;
  // As the launchers do: the server listens before the forks but serves only after them. A
  // child forked while the serving thread holds a lock (the loader's, on its first handshake)
  // would inherit it held and hang in its own handshake.
  TcpStoreServerOptions options = test_server();
  options.start = false;
  TcpStoreServer server(options);
  std::vector<pid_t> children;
  for (int r = 0; r < kWorld; ++r)
    children.push_back(fork_child([&, r] {
      server.close_in_child();
      TcpStore store(local(server.port()));
      store.add("arrived", 1);
      store.set("pid/" + std::to_string(r), std::to_string(::getpid()));
      store.barrier("exchange", r, kWorld, kLong);
      FSDP_CHECK(store.get("arrived", kLong) == std::to_string(kWorld), "count");
      for (int peer = 0; peer < kWorld; ++peer)
        FSDP_CHECK(!store.get("pid/" + std::to_string(peer), kLong).empty(), "pid");
      store.barrier("done", r, kWorld, kLong);
    }));
  server.start();
  for (pid_t pid : children) EXPECT_EQ(exit_code(pid), 0);
  TcpStore store(local(server.port()));
  EXPECT_EQ(store.get("arrived", kLong), "4");
  for (int r = 0; r < kWorld; ++r)
    EXPECT_EQ(store.get("pid/" + std::to_string(r), kLong), std::to_string(children[r]));
}

TEST(TcpStore, BarrierOfProcessesNamesTheRanksThatNeverArrived) {
  TcpStoreServer server(test_server());
  // Rank 1 arrives (and gives up at once); ranks 2 and 3 never start.
  const pid_t rank1 = fork_child([&] {
    TcpStore store(local(server.port()));
    store.barrier("start", 1, 4, Millis(1));
  });
  EXPECT_EQ(exit_code(rank1), 1);  // its own barrier timed out: it is no rank 0 to wait
  TcpStore store(local(server.port()));
  const std::string e = error_of([&] { store.barrier("start", 0, 4, Millis(100)); });
  EXPECT_TRUE(contains(e, "rendezvous 'start' timed out") &&
              contains(e, "ranks 2 and 3 of 4 never arrived"))
      << e;
}

TEST(TcpStore, GetTimesOutNamingTheKeyAndTheStore) {
  TcpStoreServer server(test_server());
  TcpStore store(local(server.port()));
  const std::string e = error_of([&] { store.get("nccl_id", Millis(20)); });
  EXPECT_TRUE(contains(e, "key 'nccl_id' was not set within 0.02 s") &&
              contains(e, "127.0.0.1:" + std::to_string(server.port())))
      << e;
}

TEST(TcpStore, ARefusedConnectionNamesTheAddressPortAndTimeTried) {
  // A socket bound but not listening: connecting to its port is refused, and no other
  // process can take the port while the socket holds it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const std::string e = error_of([&] { TcpStore store(local(port, Millis(30))); });
  ::close(fd);
  EXPECT_TRUE(contains(e, "could not connect to the store at 127.0.0.1:" + std::to_string(port)) &&
              contains(e, "tried for") && contains(e, "Connection refused"))
      << e;
}

TEST(TcpStore, AnUnknownHostIsNamed) {
  const std::string e =
      error_of([&] { TcpStore store({"no-such-host.invalid", 29500, Millis(10), kSecret}); });
  EXPECT_TRUE(contains(e, "no-such-host.invalid:29500") && contains(e, "cannot resolve"))
      << e;
}

TEST(TcpStore, AWaitingGetFailsWhenTheServersProcessIsKilled) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t host = fork_child([&] {
    TcpStoreServer server(test_server());
    const int port = server.port();
    FSDP_CHECK(::write(pipe_fds[1], &port, sizeof port) == sizeof port, "write");
    for (;;) ::pause();
  });
  int port = 0;
  ASSERT_EQ(::read(pipe_fds[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  TcpStore store(local(port));
  store.set("k", "v");
  ASSERT_EQ(store.get("k", kLong), "v");
  std::string e;
  std::thread waiter([&] { e = error_of([&] { store.get("never", kLong); }); });
  ::kill(host, SIGKILL);
  ::waitpid(host, nullptr, 0);
  waiter.join();
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  EXPECT_TRUE(contains(e, "lost the connection to the store at 127.0.0.1:" +
                              std::to_string(port)))
      << e;
  EXPECT_TRUE(contains(error_of([&] { store.set("k", "v2"); }), "lost the connection"));
}

TEST(TcpStore, AWaitingBarrierFailsWhenTheServerStops) {
  TcpStoreServer server(test_server());
  TcpStore store(local(server.port()));
  std::string e;
  std::thread waiter([&] { e = error_of([&] { store.barrier("b", 0, 2, kLong); }); });
  server.stop();
  waiter.join();
  EXPECT_TRUE(contains(e, "lost the connection")) << e;
}

// The bytes on the wire are those of Note [TCP store protocol] (PyTorch's TCPStore subset, so
// torchrun's agent store understands them): checked against a bare socket playing the server.
// A client without a secret (one of torchrun's agent store) sends no AUTH.
TEST(TcpStore, WireFormatIsTheNotesTcpStoreSubset) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  TcpStore store(local(ntohs(a.sin_port), kLong, /*secret=*/""));
  store.set("k", "vv");
  const int server = ::accept(listener, nullptr, nullptr);
  auto read_n = [&](size_t n) {
    std::string got(n, '\0');
    size_t done = 0;
    while (done < n) {
      const ssize_t r = ::read(server, got.data() + done, n - done);
      if (r <= 0) break;
      done += static_cast<size_t>(r);
    }
    return got;
  };
  const std::string le64_1("\x01\0\0\0\0\0\0\0", 8), le64_2("\x02\0\0\0\0\0\0\0", 8);
  EXPECT_EQ(read_n(5), std::string("\x00\xce\xf7\x85\x3c", 5));  // VALIDATE, 0x3C85F7CE
  EXPECT_EQ(read_n(1 + 8 + 1 + 8 + 2), "\x01" + le64_1 + "k" + le64_2 + "vv");  // SET k vv
  int64_t added = 0;
  std::thread client([&] { added = store.add("n", 5); });
  EXPECT_EQ(read_n(1 + 8 + 1 + 8), "\x04" + le64_1 + "n" + std::string("\x05\0\0\0\0\0\0\0", 8));
  const std::string reply("\x07\0\0\0\0\0\0\0", 8);  // the server says 7
  ASSERT_EQ(::write(server, reply.data(), reply.size()), 8);
  client.join();
  EXPECT_EQ(added, 7);
  std::vector<bool> present;
  std::thread checker([&] { present = store.check({"k", "x"}); });
  // One CHECK per key (a CHECK answers for all its keys together): 5, count 1, the key.
  EXPECT_EQ(read_n(2 * 18), "\x05" + le64_1 + le64_1 + "k" + "\x05" + le64_1 + le64_1 + "x");
  ASSERT_EQ(::write(server, "\x00\x01", 2), 2);  // READY, NOT_READY
  checker.join();
  EXPECT_EQ(present, (std::vector<bool>{true, false}));
  ::close(server);
  ::close(listener);
}

// DISCONNECT_NOTICE (0x70) as the Note writes it, from a bare socket: armed, then the
// connection closes with no goodbye, so the server counts it and sets the notice; a second
// armed connection that closes finds the count taken and sets nothing.
TEST(TcpStore, ADisconnectNoticeIsPostedWhenItsConnectionClosesArmed) {
  TcpStoreServer server(test_server());
  auto arm_and_close = [&](const std::string& text) {
    const int fd = admitted_socket(server.port());
    ASSERT_GE(fd, 0);
    const std::string bytes = std::string("\x70") + str("count") + str("notice") + str(text);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  };
  TcpStore store(local(server.port()));
  arm_and_close("rank 3 is gone");
  EXPECT_EQ(store.get("notice", kLong), "rank 3 is gone");
  arm_and_close("rank 4 is gone");
  // The server reaches the second close in its own time: wait (bounded) until the count says
  // so; the notice must still be the first one.
  const auto deadline = std::chrono::steady_clock::now() + kLong;
  while (store.add("count", 0) < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(store.add("count", 0), 2);
  EXPECT_EQ(store.get("notice", kLong), "rank 3 is gone");
}

TEST(TcpStore, AConnectionThatDoesNotValidateIsDropped) {
  TcpStoreServer server(test_server());
  const int fd = connect_loopback(server.port());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "GET / HTTP/1.0\r\n\r\n", 18), 18);
  char c;
  EXPECT_EQ(::read(fd, &c, 1), 0);  // closed, with no reply
  ::close(fd);
  TcpStore store(local(server.port()));  // and the server still serves
  store.set("a", "b");
  EXPECT_EQ(store.get("a", kLong), "b");
}

TEST(TcpStore, HostOrJoinGivesTheHostAServerOnAFreePort) {
  HostedStore host = host_or_join_tcp_store(true, "", 0, kLong, kSecret, "127.0.0.1");
  ASSERT_TRUE(host.server);
  EXPECT_EQ(host.server->listen_address(), "127.0.0.1");
  HostedStore peer =
      host_or_join_tcp_store(false, "localhost", host.server->port(), kLong, kSecret, "");
  EXPECT_FALSE(peer.server);
  host.store->set("id", "x");
  EXPECT_EQ(peer.store->get("id", kLong), "x");
}

}  // namespace
}  // namespace fsdp::rendezvous
