#include "launch/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include "fsdp/error.h"

namespace fsdp::launch {

namespace {

class FileStore final : public rendezvous::Store {
 public:
  explicit FileStore(std::string directory) : dir_(std::move(directory)) {}

  void set(const std::string& key, const std::string& value) override {
    // Written aside, then renamed: a reader sees the whole value or none.
    const std::string tmp = path(key) + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary);
      out << value;
      FSDP_CHECK(out.good(), "file store: cannot write '", tmp, "'");
    }
    FSDP_CHECK(::rename(tmp.c_str(), path(key).c_str()) == 0, "file store: cannot set '", key, "'");
  }

  std::string get(const std::string& key, rendezvous::Millis timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      std::ifstream in(path(key), std::ios::binary);
      if (in.good()) return std::string(std::istreambuf_iterator<char>(in), {});
      if (std::chrono::steady_clock::now() >= deadline)
        FSDP_FAIL("rendezvous: key '", key, "' was not set within ", timeout.count() / 1000.0, " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const int lock = ::open((dir_ + "/.lock").c_str(), O_CREAT | O_RDWR, 0600);
    FSDP_CHECK(lock >= 0, "file store: cannot open its lock");
    ::flock(lock, LOCK_EX);
    int64_t now = delta;
    {
      std::ifstream in(path(key));
      int64_t old = 0;
      if (in >> old) now += old;
    }
    try {
      set(key, std::to_string(now));
    } catch (...) {
      ::close(lock);
      throw;
    }
    ::close(lock);  // releases the flock
    return now;
  }

  std::vector<bool> check(const std::vector<std::string>& keys) override {
    std::vector<bool> present;
    for (const auto& k : keys) present.push_back(::access(path(k).c_str(), F_OK) == 0);
    return present;
  }

 private:
  // Keys hold '/' and more; hex makes any key a file name.
  std::string path(const std::string& key) const {
    static const char* hex = "0123456789abcdef";
    std::string name = dir_ + "/k";
    for (unsigned char c : key) {
      name += hex[c >> 4];
      name += hex[c & 15];
    }
    return name;
  }

  std::string dir_;
};

}  // namespace

std::shared_ptr<rendezvous::Store> make_file_store(const std::string& directory) {
  return std::make_shared<FileStore>(directory);
}

}  // namespace fsdp::launch
