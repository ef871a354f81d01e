// Collectives between CPU ranks that are processes, on Gloo (Debian's libgloo-dev) over its
// TCP transport. See Note [Gloo collectives] in gloo_comm.cpp. This header names no Gloo type,
// so the rest of the tree builds the same with or without Gloo.
#pragma once

#include <memory>
#include <string>

#include "fsdp/comm.h"
#include "fsdp/device.h"
#include "rendezvous/store.h"

namespace fsdp::gloo_backend {

// True when this build has the Gloo backend (CMake found libgloo-dev: FSDP_WITH_GLOO).
bool built();

struct GlooWorldOptions {
  int rank = 0;
  int size = 1;
  // The address this process's Gloo connections listen on; the other ranks must reach it
  // (on one host 127.0.0.1; across hosts this host's address on the network they share).
  std::string listen_address = "127.0.0.1";
  // Every collective, split and connection fails after this long (seconds; > 0).
  double timeout_s = 60;
  // Who hosts `store`, for the error of a collective that broke when the store broke too
  // ("rank 0", "the launcher on node 0").
  std::string store_host = "its host";
};

// Collective over the `size` ranks: each calls it once with its own CPU device (made by a
// cpu::CpuWorld of the same size). They meet through `store`, which carries Gloo's connection
// set-up too (under the key prefix "gloo/"), so Gloo needs no port or file of its own.
std::unique_ptr<Comm> make_world_comm(Device& device, std::shared_ptr<rendezvous::Store> store,
                                      const GlooWorldOptions& options);

}  // namespace fsdp::gloo_backend
