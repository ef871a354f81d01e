// The rendezvous store: the one place where the ranks of a job meet (FSDP2 and torchrun call
// it the "store"). Keys hold byte strings. Every wait has a timeout, and a timeout's error says
// what was waited for and, for a barrier, which ranks never arrived: a rank that never starts
// or dies before it meets the others ends the job with a message, not a silent hang.
//
// Implementations: MemoryStore (ranks as threads of one process, and tests) and TcpStore
// (rank 0 hosts it over TCP; the others connect). Collective back-ends (Gloo, the NCCL unique
// id) exchange their set-up bytes through it, so no other port is needed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::rendezvous {

using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` is set and returns its value; after `timeout`, throws fsdp::Error
  // naming the key.
  virtual std::string get(const std::string& key, Millis timeout) = 0;
  // Adds `delta` to the integer at `key` (0 when unset) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Which of `keys` are set now (no waiting), in the order given.
  virtual std::vector<bool> check(const std::vector<std::string>& keys) = 0;

  // Every rank of `world_size` calls it with the same `name` (use a new name each time).
  // Returns once all have; after `timeout`, throws fsdp::Error naming the ranks that never
  // arrived ("ranks 2 and 3 of 4 never reached ...").
  void barrier(const std::string& name, int rank, int world_size, Millis timeout);
  // Waits until every key is set; after `timeout`, throws naming `what` and the missing keys'
  // `labels` (labels[i] names keys[i], e.g. "rank 3").
  void wait_all(const std::vector<std::string>& keys, const std::vector<std::string>& labels,
                const std::string& what, Millis timeout);

 private:
  std::vector<size_t> missing_after(const std::vector<std::string>& keys, Millis timeout);
};

// Keys under `prefix` + "/" in `base` (one store serves several communicators).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base)
      : prefix_(std::move(prefix) + "/"), base_(std::move(base)) {}
  void set(const std::string& key, const std::string& value) override {
    base_->set(prefix_ + key, value);
  }
  std::string get(const std::string& key, Millis timeout) override {
    return base_->get(prefix_ + key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return base_->add(prefix_ + key, delta);
  }
  std::vector<bool> check(const std::vector<std::string>& keys) override;
  // What every key gets in front, with its "/".
  const std::string& prefix() const { return prefix_; }

 private:
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

// An in-process store: ranks that are threads of one process share one.
std::shared_ptr<Store> make_memory_store();

// "rank 3", "ranks 2 and 3", "ranks 1, 2 and 5" (for messages naming missing ranks).
std::string describe_ranks(const std::vector<int>& ranks);

}  // namespace fsdp::rendezvous
