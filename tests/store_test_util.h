// The TCP store's tests: a server on 127.0.0.1 with a test secret, clients that know it, and
// bare sockets that speak bytes of a test's choosing (never any address but 127.0.0.1).
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/store_auth.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/tcp_store_wire.h"

namespace fsdp::rendezvous::store_test {

inline const Millis kLong(60000);  // waits that must succeed: far longer than they ever take
inline const std::string kSecret = "the store tests' secret";

inline TcpStoreServerOptions test_server(int port = 0) {
  TcpStoreServerOptions o;
  o.port = port;
  o.secret = kSecret;
  return o;
}

inline TcpStoreOptions local(int port, Millis timeout = kLong,
                             const std::string& secret = kSecret) {
  return {"127.0.0.1", port, timeout, secret};
}

// A bare TCP connection to 127.0.0.1:port; -1 if it fails.
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A listening socket on 127.0.0.1 (a free port), for tests that play the server.
inline int listen_loopback(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0) {
    ::close(fd);
    return -1;
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

inline bool write_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Up to n bytes, waiting at most `bound` in all; fewer when the peer closed (or the bound
// passed, which a test then reports as a failure).
inline std::string read_up_to(int fd, size_t n, Millis bound = kLong) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  std::string got;
  char buf[65536];
  while (got.size() < n) {
    const auto left =
        std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) break;
    const ssize_t r = ::recv(fd, buf, std::min(sizeof buf, n - got.size()), 0);
    if (r <= 0) break;
    got.append(buf, static_cast<size_t>(r));
  }
  return got;
}

// Whether the peer closed the connection (EOF or reset) within `bound`, whatever it sent first.
inline bool closed_by_peer(int fd, Millis bound = kLong) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  char buf[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
    const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r <= 0) return true;
  }
}

inline std::string le64(uint64_t v) {
  std::string out;
  wire::put_uint(out, v, 8);
  return out;
}
inline std::string str(const std::string& s) { return le64(s.size()) + s; }
inline const std::string kValidate("\x00\xce\xf7\x85\x3c", 5);  // VALIDATE, 0x3C85F7CE
// One request: its command byte, then each string (its length, its bytes).
inline std::string request(char op, std::initializer_list<std::string> strings) {
  std::string out(1, op);
  for (const std::string& s : strings) out += str(s);
  return out;
}

// A bare socket that went through Note [Store authentication]'s handshake with `secret`:
// the fd (admitted), or -1 if the server did not admit it.
inline int admitted_socket(int port, const std::string& secret = kSecret) {
  const int fd = connect_loopback(port);
  if (fd < 0) return -1;
  const std::string nonce = auth::random_bytes(auth::kNonceBytes);
  const std::string challenge =
      write_all(fd, kValidate + "\x71" + nonce) ? read_up_to(fd, 64) : std::string();
  const bool ok = challenge.size() == 64 &&
                  write_all(fd, auth::client_proof(secret, challenge.substr(0, 32), nonce)) &&
                  read_up_to(fd, 1) == std::string(1, '\0');
  if (!ok) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Waits (bounded) until `done()`; false if the bound passed first.
inline bool eventually(const std::function<bool()>& done, Millis bound = kLong) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// "127.0.0.1:PORT" (or "[::]:PORT") for each listening TCP socket that process `pid` holds,
// as the kernel lists them (/proc/PID/fd and /proc/net/tcp, tcp6), sorted.
inline std::vector<std::string> listening_addresses(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(fd_dir.c_str())) {
    while (dirent* entry = ::readdir(d)) {
      char target[64] = {};
      const std::string link = fd_dir + "/" + entry->d_name;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      const std::string t(target, n > 0 ? static_cast<size_t>(n) : 0);
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(d);
  }
  std::vector<std::string> found;
  for (const bool v6 : {false, true}) {
    std::ifstream table(v6 ? "/proc/net/tcp6" : "/proc/net/tcp");
    std::string line;
    std::getline(table, line);  // the heading
    while (std::getline(table, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, skip, inode;
      fields >> slot >> local >> remote >> state;
      for (int i = 0; i < 5; ++i) fields >> skip;  // tx:rx, tr:when, retrnsmt, uid, timeout
      fields >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
      const size_t colon = local.find(':');
      const std::string hex = local.substr(0, colon);
      const int port = std::stoi(local.substr(colon + 1), nullptr, 16);
      char text[INET6_ADDRSTRLEN] = {};
      if (!v6) {
        in_addr a{};
        a.s_addr = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));  // as stored
        ::inet_ntop(AF_INET, &a, text, sizeof text);
        found.push_back(std::string(text) + ":" + std::to_string(port));
      } else {
        in6_addr a{};
        for (int w = 0; w < 4; ++w) {
          const auto word = static_cast<uint32_t>(std::stoul(hex.substr(8 * w, 8), nullptr, 16));
          std::memcpy(reinterpret_cast<char*>(&a) + 4 * w, &word, 4);
        }
        ::inet_ntop(AF_INET6, &a, text, sizeof text);
        found.push_back(std::string("[") + text + "]:" + std::to_string(port));
      }
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace fsdp::rendezvous::store_test
