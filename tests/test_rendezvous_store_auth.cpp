// Note [Store authentication]: our store admits only clients that prove they know the job's
// secret, before it serves them anything; a client trusts only a server that proves the same;
// the secret never crosses the wire. All against servers and bare sockets on 127.0.0.1.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "fsdp/error.h"
#include "rendezvous/store_auth.h"
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

// A stranger (no secret) who connects and speaks the protocol as torchrun's clients do: the
// server closes the connection with no reply, and no command of it took effect.
TEST(StoreAuth, AStrangerIsDroppedBeforeAnyCommand) {
  TcpStoreServer server(test_server());
  TcpStore rank(local(server.port()));
  rank.set("gloo/rank0", "rank 0's address");
  const int stranger = connect_loopback(server.port());
  ASSERT_GE(stranger, 0);
  ASSERT_TRUE(write_all(stranger, kValidate + "\x03" + str("gloo/rank0") +  // GET
                                      "\x01" + str("gloo/rank0") + str("forged")));  // SET
  EXPECT_EQ(read_up_to(stranger, 1), "");  // closed, and not a byte of the value came back
  ::close(stranger);
  EXPECT_EQ(rank.get("gloo/rank0", kLong), "rank 0's address");
  const TcpStoreServer::Stats s = server.stats();
  EXPECT_EQ(s.dropped_unadmitted, 1u);
  EXPECT_EQ(s.admitted, 1u);  // the rank alone
}

// A client that answers the challenge without the secret is refused in one byte, and closed.
TEST(StoreAuth, AWrongProofIsRefused) {
  TcpStoreServer server(test_server());
  const int fd = connect_loopback(server.port());
  ASSERT_GE(fd, 0);
  const std::string nonce = auth::random_bytes(auth::kNonceBytes);
  ASSERT_TRUE(write_all(fd, kValidate + "\x71" + nonce));
  const std::string challenge = read_up_to(fd, 64);
  ASSERT_EQ(challenge.size(), 64u);
  // The server proved that it knows the secret...
  EXPECT_EQ(challenge.substr(32), auth::server_proof(kSecret, nonce, challenge.substr(0, 32)));
  // ... this client cannot.
  const std::string server_nonce = challenge.substr(0, 32);
  ASSERT_TRUE(write_all(fd, auth::client_proof("a guessed secret!", server_nonce, nonce)));
  EXPECT_EQ(read_up_to(fd, 2), std::string(1, '\x01'));  // refused, then closed
  ::close(fd);
  EXPECT_EQ(server.stats().refused_secrets, 1u);
  EXPECT_EQ(server.stats().admitted, 0u);
}

TEST(StoreAuth, AClientWithAnotherSecretFailsNamingTheSecret) {
  TcpStoreServer server(test_server());
  const std::string e = error_of([&] {
    TcpStore store(local(server.port(), kLong, "another job's secret"));
  });
  EXPECT_TRUE(contains(e, "the store at 127.0.0.1:" + std::to_string(server.port()) +
                              " did not prove that it knows this job's secret") &&
              contains(e, "FSDP_STORE_SECRET"))
      << e;
  TcpStore rank(local(server.port()));  // the server still serves those who know it
  EXPECT_EQ(rank.add("n", 1), 1);
}

// A server that does not know the secret (something else listening on the port) is not
// trusted, and the client sends it nothing past its hello: no proof to learn from.
TEST(StoreAuth, AServerThatCannotProveTheSecretIsNotTrusted) {
  int port = 0;
  const int listener = listen_loopback(port);
  ASSERT_GE(listener, 0);
  std::string seen;
  std::thread impostor([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    seen = read_up_to(fd, 38);
    write_all(fd, auth::random_bytes(64));  // a nonce, and a "proof"
    seen += read_up_to(fd, 1000);           // until the client hangs up
    ::close(fd);
  });
  const std::string e = error_of([&] { TcpStore store(local(port)); });
  impostor.join();
  ::close(listener);
  EXPECT_TRUE(contains(e, "did not prove that it knows this job's secret")) << e;
  EXPECT_EQ(seen.size(), 38u);  // VALIDATE, AUTH and the client's nonce: no proof
}

// The client's side of the handshake, against a bare socket that plays our server: what it
// sends is the Note's format, its proof is good for this connection's nonces only, and the
// secret is nowhere in it.
TEST(StoreAuth, TheSecretNeverCrossesTheWire) {
  int port = 0;
  const int listener = listen_loopback(port);
  ASSERT_GE(listener, 0);
  std::vector<std::string> sent(2);
  std::vector<std::string> server_nonces(2);
  std::thread server([&] {
    for (int i = 0; i < 2; ++i) {
      const int fd = ::accept(listener, nullptr, nullptr);
      sent[i] = read_up_to(fd, 38);
      const std::string client_nonce = sent[i].substr(6);
      server_nonces[i] = auth::random_bytes(32);
      write_all(fd, server_nonces[i] + auth::server_proof(kSecret, client_nonce, server_nonces[i]));
      sent[i] += read_up_to(fd, 32);
      write_all(fd, std::string(1, '\0'));  // admitted
      sent[i] += read_up_to(fd, 1 + 8 + 1 + 8 + 1);  // the SET that follows
      ::close(fd);
    }
  });
  for (int i = 0; i < 2; ++i) {
    TcpStore store(local(port));
    store.set("k", "v");
  }
  server.join();
  ::close(listener);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(sent[i].size(), 38u + 32u + 19u);
    EXPECT_EQ(sent[i].substr(0, 6), kValidate + "\x71");
    EXPECT_EQ(sent[i].substr(38, 32),
              auth::client_proof(kSecret, server_nonces[i], sent[i].substr(6, 32)));
    EXPECT_EQ(sent[i].substr(70), std::string("\x01") + str("k") + str("v"));
    EXPECT_FALSE(contains(sent[i], kSecret));
  }
  EXPECT_NE(sent[0].substr(6, 64), sent[1].substr(6, 64));  // fresh nonces, fresh proofs
}

// Note [Store limits]: a connection that does not finish its handshake in time is dropped
// (a short deadline, injected); a rank admitted long before is not.
TEST(StoreAuth, AHandshakeNotFinishedInTimeIsDropped) {
  TcpStoreServerOptions o = test_server();
  o.limits.auth_timeout = Millis(200);
  TcpStoreServer server(o);
  TcpStore rank(local(server.port()));
  rank.set("k", "v");
  const int idle = connect_loopback(server.port());
  ASSERT_GE(idle, 0);
  const int half = connect_loopback(server.port());  // sends its hello, never its proof
  ASSERT_GE(half, 0);
  ASSERT_TRUE(write_all(half, kValidate + "\x71" + auth::random_bytes(32)));
  EXPECT_TRUE(closed_by_peer(idle));
  EXPECT_TRUE(closed_by_peer(half));
  ::close(idle);
  ::close(half);
  EXPECT_EQ(server.stats().dropped_unadmitted, 2u);
  EXPECT_EQ(rank.get("k", kLong), "v");  // older than the deadline, and still served
}

TEST(StoreAuth, AServerNeedsASecretUnlessOpen) {
  TcpStoreServerOptions o;
  EXPECT_TRUE(contains(error_of([&] { TcpStoreServer s(o); }), "needs the job's secret"));
}

TEST(StoreSecret, ASecretIsCheckedAndAFileMustBeARegularSmallOne) {
  EXPECT_TRUE(contains(error_of([] { auth::check_secret("short", "FSDP_STORE_SECRET"); }),
                       "FSDP_STORE_SECRET holds 5 bytes; the store's secret must have 16 to 4096"));
  const std::string dir = ::testing::TempDir() + "store_secret_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  {
    std::ofstream(dir + "/ok") << "0123456789abcdef0123\n";
    std::ofstream(dir + "/big") << std::string(5000, 'x');
  }
  EXPECT_EQ(auth::read_secret_file(dir + "/ok"), "0123456789abcdef0123");
  EXPECT_TRUE(contains(error_of([&] { auth::read_secret_file(dir + "/big"); }),
                       "is larger than a secret"));
  EXPECT_TRUE(contains(error_of([&] { auth::read_secret_file(dir); }), "is not a regular file"));
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0600), 0);  // opening must not wait for a writer
  EXPECT_TRUE(contains(error_of([&] { auth::read_secret_file(dir + "/fifo"); }),
                       "is not a regular file"));
  EXPECT_TRUE(contains(error_of([&] { auth::read_secret_file(dir + "/missing"); }),
                       "cannot open it"));
  EXPECT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
  const std::string a = auth::new_secret(), b = auth::new_secret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace fsdp::rendezvous
