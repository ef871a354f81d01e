// The Gloo backend's entry points in a build without Gloo (libgloo-dev was not found).
#include "backend/gloo/gloo_backend.h"
#include "fsdp/error.h"

namespace fsdp::gloo_backend {

bool built() { return false; }

std::unique_ptr<Comm> make_world_comm(Device&, std::shared_ptr<rendezvous::Store>,
                                      const GlooWorldOptions&) {
  FSDP_USER_FAIL("this build has no Gloo, which CPU ranks as processes need "
                 "(install libgloo-dev and configure again)");
}

}  // namespace fsdp::gloo_backend
