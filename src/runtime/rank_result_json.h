// A rank's RankResult as JSON, for ranks that are processes: the launcher's children send
// theirs back to the parent this way (GPU ranks, and CPU ranks as processes).
#pragma once

#include <string>

#include "runtime/trainer.h"

namespace fsdp::runtime {

std::string rank_result_to_json(const RankResult& r);
RankResult rank_result_from_json(const std::string& text);

}  // namespace fsdp::runtime
