// A rendezvous store in a directory that every process of one host can see: each key is a
// file. The launcher of CPU ranks as processes uses it on one host until the TCP store is
// in; processes on other hosts cannot reach it.
#pragma once

#include <memory>
#include <string>

#include "rendezvous/store.h"

namespace fsdp::launch {

std::shared_ptr<rendezvous::Store> make_file_store(const std::string& directory);

}  // namespace fsdp::launch
