// A store over an in-process one that counts what check() is asked (rendezvous tests): the
// calls, and the keys over all of them. Tests wait for a number of reads instead of a time.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store.h"

namespace fsdp::rendezvous {

class CountingStore final : public Store {
 public:
  std::shared_ptr<Store> base = make_memory_store();
  std::atomic<int> checks{0};
  std::atomic<int64_t> checked_keys{0};
  void set(const std::string& k, const std::string& v) override { base->set(k, v); }
  std::string get(const std::string& k, Millis t) override { return base->get(k, t); }
  int64_t add(const std::string& k, int64_t d) override { return base->add(k, d); }
  std::vector<bool> check(const std::vector<std::string>& keys) override {
    ++checks;
    checked_keys += static_cast<int64_t>(keys.size());
    return base->check(keys);
  }
};

}  // namespace fsdp::rendezvous
