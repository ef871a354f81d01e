#include "rendezvous/store.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "fsdp/error.h"

namespace fsdp::rendezvous {

namespace {

std::string seconds_text(Millis t) {
  const double s = static_cast<double>(t.count()) / 1000.0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    changed_.notify_all();
  }
  std::string get(const std::string& key, Millis timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!changed_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; }))
      FSDP_USER_FAIL("rendezvous: key '", key, "' was not set within ", seconds_text(timeout));
    return values_[key];
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = values_.find(key);
      now = (it == values_.end() ? 0 : std::stoll(it->second)) + delta;
      values_[key] = std::to_string(now);
    }
    changed_.notify_all();
    return now;
  }
  std::vector<bool> check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<bool> present;
    for (const auto& k : keys) present.push_back(values_.count(k) > 0);
    return present;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace

std::string describe_ranks(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

// Polls until every key is set or the deadline passes; returns the indices still missing.
std::vector<size_t> Store::missing_after(const std::vector<std::string>& keys, Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Millis pause(1);
  for (;;) {
    const std::vector<bool> present = check(keys);
    std::vector<size_t> missing;
    for (size_t i = 0; i < keys.size(); ++i)
      if (!present[i]) missing.push_back(i);
    if (missing.empty() || std::chrono::steady_clock::now() >= deadline) return missing;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, Millis(50));
  }
}

void Store::wait_all(const std::vector<std::string>& keys, const std::vector<std::string>& labels,
                     const std::string& what, Millis timeout) {
  FSDP_CHECK(keys.size() == labels.size(), "wait_all: one label per key");
  const std::vector<size_t> missing = missing_after(keys, timeout);
  if (missing.empty()) return;
  std::string names;
  for (size_t i : missing) names += (names.empty() ? "" : ", ") + labels[i];
  FSDP_USER_FAIL(what, " timed out after ", seconds_text(timeout), "; still missing: ", names);
}

// Each rank sets its own key (so a timeout can name the absent) and bumps a counter; the
// wait polls the counter alone, so one poll costs one request however many ranks there are.
void Store::barrier(const std::string& name, int rank, int world_size, Millis timeout) {
  const std::string base = "barrier/" + name + "/";
  set(base + std::to_string(rank), "1");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Millis pause(1);
  int64_t arrived = add(base + "count", 1);
  while (arrived < world_size && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, Millis(50));
    arrived = add(base + "count", 0);
  }
  if (arrived >= world_size) return;
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(base + std::to_string(r));
  const std::vector<bool> present = check(keys);
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r)
    if (!present[r]) missing.push_back(r);
  if (missing.empty()) return;
  FSDP_USER_FAIL("rendezvous '", name, "' timed out after ", seconds_text(timeout), ": ",
            describe_ranks(missing), " of ", world_size, " never arrived");
}

std::vector<bool> PrefixStore::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full;
  for (const auto& k : keys) full.push_back(prefix_ + k);
  return base_->check(full);
}

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

}  // namespace fsdp::rendezvous
