// Gloo's rendezvous store interface over ours (rendezvous::Store), so that Gloo exchanges its
// connection addresses through the job's store instead of a port or file of its own.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "rendezvous/store.h"

namespace fsdp::gloo_backend {

class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  // Every get and wait gives up after `timeout` with an fsdp::Error naming the missing keys.
  GlooStoreAdapter(std::shared_ptr<rendezvous::Store> store, rendezvous::Millis timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<rendezvous::Store> store_;
  rendezvous::Millis timeout_;
};

}  // namespace fsdp::gloo_backend
