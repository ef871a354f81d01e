// See Note [Store authentication] in store_auth.h. The HMAC is OpenSSL's (libcrypto,
// Debian's libssl-dev): a well-kept implementation rather than one of our own.
#include "rendezvous/store_auth.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#if FSDP_HAVE_OPENSSL
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#else
#include <dlfcn.h>
#endif

#include "fsdp/error.h"

namespace fsdp::rendezvous::auth {

namespace {

#if FSDP_HAVE_OPENSSL
std::string hmac(const std::string& secret, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  const unsigned char* ok =
      ::HMAC(::EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
             reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  FSDP_CHECK(ok && len == kProofBytes, "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(out), len);
}
#else
// Without OpenSSL's headers at build time (a GPU image with no libssl-dev, say): the same
// libcrypto, loaded when the handshake first needs it, through its stable C interface.
std::string hmac(const std::string& secret, const std::string& message) {
  using Md = const void* (*)();
  using Hmac = unsigned char* (*)(const void*, const void*, int, const unsigned char*, size_t,
                                  unsigned char*, unsigned int*);
  static void* lib = [] {
    void* h = ::dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    return h ? h : ::dlopen("libcrypto.so", RTLD_NOW | RTLD_LOCAL);
  }();
  FSDP_USER_CHECK(lib, "the rendezvous store's handshake needs HMAC-SHA256 from OpenSSL's "
                  "libcrypto, which this build was made without and this machine does not have "
                  "(install libssl-dev or libssl3)");
  const auto sha256 = reinterpret_cast<Md>(::dlsym(lib, "EVP_sha256"));
  const auto mac = reinterpret_cast<Hmac>(::dlsym(lib, "HMAC"));
  FSDP_USER_CHECK(sha256 && mac, "this machine's libcrypto has no HMAC or EVP_sha256");
  unsigned char out[64];
  unsigned int len = 0;
  const unsigned char* ok =
      mac(sha256(), secret.data(), static_cast<int>(secret.size()),
          reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len);
  FSDP_CHECK(ok && len == kProofBytes, "HMAC-SHA256 failed");
  return std::string(reinterpret_cast<const char*>(out), len);
}
#endif

}  // namespace

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::getrandom(out.data() + done, n - done, 0);
    if (got < 0 && errno == EINTR) continue;
    FSDP_CHECK(got > 0, "getrandom failed: ", std::strerror(errno));
    done += static_cast<size_t>(got);
  }
  return out;
}

std::string new_secret() {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : random_bytes(32)) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

std::string server_proof(const std::string& secret, const std::string& client_nonce,
                         const std::string& server_nonce) {
  return hmac(secret, std::string("fsdp store server proof") + '\0' + client_nonce + server_nonce);
}

std::string client_proof(const std::string& secret, const std::string& server_nonce,
                         const std::string& client_nonce) {
  return hmac(secret, std::string("fsdp store client proof") + '\0' + server_nonce + client_nonce);
}

bool same_bytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  // Constant time: how much of a proof matched must not show in how long refusing it took.
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void check_secret(const std::string& secret, const std::string& source) {
  FSDP_USER_CHECK(secret.size() >= kMinSecretBytes && secret.size() <= kMaxSecretBytes, source,
                  " holds ", secret.size(), " bytes; the store's secret must have ",
                  kMinSecretBytes, " to ", kMaxSecretBytes,
                  " (make one with: openssl rand -hex 32)");
}

std::string read_secret_file(const std::string& path) {
  const std::string what = "FSDP_STORE_SECRET_FILE=" + path;
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  FSDP_USER_CHECK(fd >= 0, what, ": cannot open it: ", std::strerror(errno));
  struct stat st {};
  std::string secret;
  bool regular = false, small = false;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
    regular = true;
    small = st.st_size <= static_cast<off_t>(kMaxSecretBytes + 2);
    if (small) {
      char buf[kMaxSecretBytes + 3];
      ssize_t n = 0;
      size_t got = 0;
      while (got < sizeof buf && (n = ::read(fd, buf + got, sizeof buf - got)) != 0) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        got += static_cast<size_t>(n);
      }
      small = n >= 0 && got <= kMaxSecretBytes + 2;  // it may have grown since fstat
      secret.assign(buf, got);
    }
  }
  ::close(fd);
  FSDP_USER_CHECK(regular, what, " is not a regular file");
  FSDP_USER_CHECK(small, what, " is larger than a secret (at most ", kMaxSecretBytes, " bytes)");
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  check_secret(secret, what);
  return secret;
}

}  // namespace fsdp::rendezvous::auth
