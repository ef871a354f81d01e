// The store's server: what it makes of a client's bytes (Note [TCP store protocol] in
// tcp_store_server.cpp, Note [Store authentication] in store_auth.h).
#include <exception>

#include "rendezvous/store_auth.h"
#include "rendezvous/tcp_store_connection.h"
#include "rendezvous/tcp_store_wire.h"

namespace fsdp::rendezvous::server {

using namespace wire;

namespace {

// Reads one request from a connection's input; each read returns false when its bytes have
// not all arrived yet (the request is then parsed again once more came in).
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
  bool bytes(std::string& s, size_t n) {
    if (in.size() - pos < n) return false;
    s.assign(in, pos, n);
    pos += n;
    return true;
  }
  bool string(std::string& s, uint64_t limit) {
    uint64_t n = 0;
    if (!uint(n, 8)) return false;
    if (n > limit) {
      bad = true;
      return false;
    }
    return bytes(s, n);
  }
};

enum class Step { Done, Incomplete, Close };

// The handshake, up to admission. Before it, a client sends exactly what the handshake
// asks and then waits for the answer, so anything more is not one of ours.
Step handshake(Connection& c, Cursor& r, const ServePolicy& p, ServeCounts& counts) {
  if (c.stage == Connection::Stage::Hello) {
    uint64_t op = 0, magic = 0;
    if (!r.uint(op, 1)) return Step::Incomplete;
    if (op != kValidate) return Step::Close;
    if (!r.uint(magic, 4)) return Step::Incomplete;
    if (magic != kMagic) return Step::Close;
    if (p.open) {
      c.stage = Connection::Stage::Admitted;
      ++counts.admitted;
      return Step::Done;
    }
    uint64_t auth = 0;
    if (!r.uint(auth, 1)) return Step::Incomplete;
    if (auth != kAuth) return Step::Close;  // a command before admission
    if (!r.bytes(c.client_nonce, auth::kNonceBytes)) return Step::Incomplete;
    if (r.pos != c.in.size()) return Step::Close;
    c.server_nonce = auth::random_bytes(auth::kNonceBytes);
    c.out += c.server_nonce;
    c.out += auth::server_proof(p.secret, c.client_nonce, c.server_nonce);
    c.stage = Connection::Stage::Proof;
    return Step::Done;
  }
  std::string proof;
  if (!r.bytes(proof, auth::kProofBytes)) return Step::Incomplete;
  if (r.pos != c.in.size()) return Step::Close;
  if (!auth::same_bytes(proof, auth::client_proof(p.secret, c.server_nonce, c.client_nonce))) {
    c.out.push_back(static_cast<char>(kRefused));
    c.closing = true;
    ++counts.refused_secrets;
    return Step::Done;
  }
  c.out.push_back(static_cast<char>(kAdmitted));
  c.stage = Connection::Stage::Admitted;
  ++counts.admitted;
  return Step::Done;
}

// One command of an admitted client.
Step command(Connection& c, Cursor& r, KeyValues& kv, const ServePolicy& p) {
  uint64_t op = 0;
  if (!r.uint(op, 1)) return Step::Incomplete;
  auto short_or_bad = [&] { return r.bad ? Step::Close : Step::Incomplete; };
  if (op == kSet) {
    std::string key, value;
    if (!r.string(key, kMaxKeyBytes) || !r.string(value, p.limits.max_value_bytes))
      return short_or_bad();
    kv[key] = std::move(value);
  } else if (op == kGet) {
    std::string key;
    if (!r.string(key, kMaxKeyBytes)) return short_or_bad();
    auto it = kv.find(key);
    put_string(c.out, it == kv.end() ? std::string() : it->second);
  } else if (op == kAdd) {
    std::string key;
    uint64_t delta = 0;
    if (!r.string(key, kMaxKeyBytes) || !r.uint(delta, 8)) return short_or_bad();
    int64_t now = 0;
    if (!add_to(kv, key, static_cast<int64_t>(delta), now)) return Step::Close;  // no number
    put_uint(c.out, static_cast<uint64_t>(now), 8);
  } else if (op == kCheck) {
    uint64_t n = 0;
    if (!r.uint(n, 8)) return Step::Incomplete;
    if (n > kMaxKeys) return Step::Close;
    bool all = true;
    for (uint64_t i = 0; i < n; ++i) {
      std::string key;
      if (!r.string(key, kMaxKeyBytes)) return short_or_bad();
      all = all && kv.count(key) > 0;
    }
    c.out.push_back(static_cast<char>(all ? kReady : kNotReady));
  } else if (op == kDisconnectNotice) {
    std::string count_key, key, text;
    if (!r.string(count_key, kMaxKeyBytes) || !r.string(key, kMaxKeyBytes) ||
        !r.string(text, p.limits.max_value_bytes))
      return short_or_bad();
    c.notice_count_key = std::move(count_key);
    c.notice_key = std::move(key);
    c.notice = std::move(text);
  } else {
    return Step::Close;  // a command this server does not implement
  }
  return Step::Done;
}

}  // namespace

bool add_to(KeyValues& kv, const std::string& key, int64_t delta, int64_t& now) {
  auto it = kv.find(key);
  now = delta;
  if (it != kv.end()) {
    try {
      now += std::stoll(it->second);
    } catch (const std::exception&) {
      return false;
    }
  }
  kv[key] = std::to_string(now);
  return true;
}

void serve_requests(Connection& c, KeyValues& kv, const ServePolicy& p, ServeCounts& counts) {
  while (!c.closed && !c.closing && c.unparsed() > 0 &&
         c.pending_out() < p.limits.max_pending_reply_bytes) {
    Cursor r{c.in, c.in_pos};
    const bool admitted = c.admitted();
    const Step step = admitted ? command(c, r, kv, p) : handshake(c, r, p, counts);
    if (step == Step::Close) {
      if (!admitted) ++counts.dropped_unadmitted;
      c.closed = true;
      return;
    }
    if (step == Step::Incomplete) {
      // A request that could not fit in the most a client may have buffered never will.
      if (c.unparsed() >= p.max_request_bytes) c.closed = true;
      return;
    }
    c.in_pos = r.pos;
    if (admitted) ++counts.requests;
  }
}

}  // namespace fsdp::rendezvous::server
