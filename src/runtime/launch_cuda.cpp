// The trainer on GPUs: the public launcher (include/fsdp/launch.h, Note [Launching on GPUs])
// runs train_rank on each rank; a rank's RankResult travels back to the parent as JSON.
#include "runtime/launch_cuda.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fsdp/launch.h"
#include "runtime/rank_result_json.h"

namespace fsdp::runtime {

std::vector<RankResult> run_cuda_training(const LaunchOptions& options, const TrainConfig& config,
                                          const std::function<void(const StepReport&)>& on_step,
                                          int& world_out) {
  const CudaLaunch launch = run_cuda_ranks_with_results(
      options, [&](int rank, Device& device, std::shared_ptr<Comm> world) {
        return rank_result_to_json(train_rank(device, world, config, rank == 0 ? on_step : nullptr));
      });
  world_out = launch.world_size;
  if (launch.first_rank > 0) {  // only the process that ran rank 0 reports
    std::fflush(stdout);
    std::_Exit(0);
  }
  std::vector<RankResult> results;
  for (const std::string& r : launch.results) results.push_back(rank_result_from_json(r));
  return results;
}

}  // namespace fsdp::runtime
