// The rendezvous store's wire format (Note [TCP store protocol] in tcp_store_server.cpp),
// shared by its server and its client.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::rendezvous::wire {

inline constexpr uint8_t kValidate = 0, kSet = 1, kGet = 3, kAdd = 4, kCheck = 5;
inline constexpr uint8_t kDisconnectNotice = 0x70;
inline constexpr uint8_t kAuth = 0x71;  // Note [Store authentication]
inline constexpr uint32_t kMagic = 0x3C85F7CE;
inline constexpr uint8_t kReady = 0, kNotReady = 1;
inline constexpr uint8_t kAdmitted = 0, kRefused = 1;  // the server's last handshake byte
// The most a client accepts in one reply, and the most any server limit may allow.
inline constexpr uint64_t kMaxKeyBytes = 64 << 10, kMaxValueBytes = 256ull << 20;
inline constexpr uint64_t kMaxKeys = 1 << 20;
// What our server takes in one SET unless told otherwise (TcpStoreLimits).
inline constexpr uint64_t kDefaultMaxValueBytes = 16ull << 20;

inline void put_uint(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_string(std::string& out, const std::string& s) {
  put_uint(out, s.size(), 8);
  out += s;
}
inline uint64_t get_uint(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace fsdp::rendezvous::wire
