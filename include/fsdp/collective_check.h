// Collective fingerprints: a debug mode that turns a collective issued differently on two
// ranks into an fsdp::Error naming both sides, instead of a hang or silent corruption.
//
//   std::shared_ptr<fsdp::Comm> world = fsdp::with_collective_checks(raw_world, device);
//   fsdp::Mesh mesh("dp", device, world);   // every collective on it (and on its splits) checked
//
// Before each collective on the returned communicator, every member compares a fingerprint
// of it (sequence number, op, communicator name, byte count, dtype, reduce op, root) with
// every other member's. A difference throws on every member, e.g.
//   collective 17 on 'dp': rank 0 issued all_gather of 4096 bytes (fp32), rank 1 issued
//   reduce_scatter (sum) of 8192 bytes (fp32)
// (ranks are the launch's global ranks). See Note [Collective fingerprints] in
// src/comm/collective_check.cpp for what it costs and why it works on every backend.
#pragma once

#include <memory>

#include "fsdp/comm.h"
#include "fsdp/device.h"

namespace fsdp {

// Wraps `comm`; communicators split from the result are checked too. `device` is the one the
// communicator's collectives run on and must outlive the result. Comm::issued on the result
// counts the collectives the caller issued, not the fingerprint exchanges.
std::shared_ptr<Comm> with_collective_checks(std::shared_ptr<Comm> comm, Device& device);

}  // namespace fsdp
