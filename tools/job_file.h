// `--config FILE`: a job file of a command's flags (Note [Job files]).
#pragma once

#include <CLI/CLI.hpp>

namespace fsdp::tools {

// Adds --config FILE to `cmd` (train, and the commands that take the train flags).
void add_job_file_option(CLI::App& cmd);
// After `cmd` was parsed: sets each flag the job file names and the command line did not give.
// One-line UserErrors for a file that is not a regular file of at most 1 MiB, a key that is no
// flag of `cmd`, a section, or a value the flag refuses.
void apply_job_file(CLI::App& cmd);

}  // namespace fsdp::tools
