// One parsed copy of a file per process while any thread holds it (Note [Shared readers] in
// src/checkpoint/row_reader.h).
#pragma once

#include <sys/stat.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "io/file_io.h"

namespace fsdp::io {

// The identity of what `path` names now; false when it names no file.
inline bool identity_of_path(const std::string& path, FileIdentity& out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  out = {st.st_dev, st.st_ino, static_cast<uint64_t>(st.st_size),
         static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
  return true;
}

// The T that make() builds for `key` (a path) and `ids` (the identities of the files it reads):
// the first thread to ask builds it while the others asking for the same wait, and all get the
// one copy for as long as any holds it. A make() that throws is tried again by the next.
template <typename T>
std::shared_ptr<const T> shared_by_identity(const std::string& key,
                                            const std::vector<FileIdentity>& ids,
                                            const std::function<std::shared_ptr<const T>()>& make) {
  struct Slot {
    std::mutex mutex;
    std::weak_ptr<const T> value;
  };
  using Key = std::pair<std::string, std::vector<FileIdentity>>;
  static std::mutex slots_mutex;
  static std::map<Key, std::shared_ptr<Slot>> slots;
  std::shared_ptr<Slot> slot;
  {
    std::lock_guard<std::mutex> lock(slots_mutex);
    for (auto it = slots.begin(); it != slots.end();)  // forget what no one holds or waits for
      it = it->second->value.expired() && it->second.use_count() == 1 ? slots.erase(it)
                                                                      : std::next(it);
    std::shared_ptr<Slot>& s = slots[{key, ids}];
    if (!s) s = std::make_shared<Slot>();
    slot = s;
  }
  std::lock_guard<std::mutex> lock(slot->mutex);
  if (std::shared_ptr<const T> v = slot->value.lock()) return v;
  std::shared_ptr<const T> v = make();
  slot->value = v;
  return v;
}

}  // namespace fsdp::io
