// Starting ranks for the trainer and the tests: the public launcher (include/fsdp/launch.h),
// with the CPU backend's full options.
#pragma once

#include "launch/cpu_ranks.h"

namespace fsdp::runtime {

using fsdp::RankBody;

// Runs `body` on `world_size` rank threads sharing one CpuWorld. If any rank throws, the
// world is aborted (so the others stop instead of hanging) and the first error is rethrown.
inline void run_cpu_ranks(int world_size, const cpu::CpuOptions& options, const RankBody& body) {
  launch::run_cpu_world(world_size, options, body);
}

}  // namespace fsdp::runtime
