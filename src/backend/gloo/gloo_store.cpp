#include "backend/gloo/gloo_store.h"

namespace fsdp::gloo_backend {

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, std::string(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  const std::string value = store_->get(key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  std::vector<std::string> labels;
  for (const std::string& k : keys) labels.push_back("key '" + k + "'");
  // Gloo passes its context's timeout; ours bounds it when Gloo passes none.
  const auto limit = timeout.count() > 0 ? timeout : timeout_;
  store_->wait_all(keys, labels, "Gloo's connection set-up", limit);
}

}  // namespace fsdp::gloo_backend
