// Note [Store authentication]
// Our store's server admits a connection only once the client has shown that it knows the
// job's secret, and the client goes on only once the server has shown the same: a
// challenge-response in which the secret never crosses the wire. After VALIDATE the client
// sends (Note [TCP store protocol])
//   AUTH (0x71), its nonce (32 random bytes)
// the server answers with its own nonce and its proof, HMAC-SHA256(secret, "fsdp store
// server proof" | client nonce | server nonce); the client checks it, then sends its proof,
// HMAC-SHA256(secret, "fsdp store client proof" | server nonce | client nonce), and the
// server answers one byte: 0 admitted, 1 refused (and closes). The two proofs carry
// different labels, so neither side's answer can be replayed as the other's, and fresh
// nonces on both sides make an answer good for one connection only. Before the admission
// the server serves nothing: any other command closes the connection, and so does a
// handshake not finished within the server's auth timeout.
// Only the connections are authenticated: the bytes after the handshake are neither
// encrypted nor signed, so the store belongs on a network that no stranger can tamper with
// (docs/launch.md). torchrun's agent store knows nothing of this; a client joining it
// sends no AUTH (TcpStoreOptions::secret empty).
// Where the secret comes from (docs/launch.md): fsdp's own launcher on one host makes one
// (new_secret) and its forked ranks inherit it; ranks on several hosts, or started by
// torchrun, srun or mpirun, read FSDP_STORE_SECRET or FSDP_STORE_SECRET_FILE.
#pragma once

#include <cstddef>
#include <string>

namespace fsdp::rendezvous::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256
// A secret is bytes; shorter ones are too easy to guess, longer ones are not secrets.
inline constexpr size_t kMinSecretBytes = 16;
inline constexpr size_t kMaxSecretBytes = 4096;

// `n` bytes from the kernel's random number generator (getrandom).
std::string random_bytes(size_t n);
// A fresh secret for one job: 32 random bytes, as 64 hex digits.
std::string new_secret();

std::string server_proof(const std::string& secret, const std::string& client_nonce,
                         const std::string& server_nonce);
std::string client_proof(const std::string& secret, const std::string& server_nonce,
                         const std::string& client_nonce);
// a == b, in a time that does not depend on where they differ.
bool same_bytes(const std::string& a, const std::string& b);

// Throws a one-line UserError naming `source` (e.g. "FSDP_STORE_SECRET") when `secret` is
// too short or too long to be one.
void check_secret(const std::string& secret, const std::string& source);
// The secret held in the file at `path`: a regular file of at most kMaxSecretBytes (one
// trailing newline is not part of it). A one-line UserError for anything else.
std::string read_secret_file(const std::string& path);

}  // namespace fsdp::rendezvous::auth
