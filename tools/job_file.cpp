// Note [Job files]
// `fsdp train --config job.toml` reads a TOML file whose keys are the command's flags without
// their dashes (`layers = 16`, `rope-theta = 500000.0`, `tie-embeddings = true`; '_' may stand
// for '-'). The command line wins: a flag given there keeps its value, whatever the file says.
// A key that is no flag of the command, a [section], or a value the flag refuses ends the run
// in one line naming the file and the key: nothing in a job file is ignored.
//
// CLI11 reads config files itself, but in this version only for the top-level app (with a
// [train] section per subcommand) and from a path it opens unchecked. So the file is read here,
// bounded and checked to be a regular file first (io::read_bounded_file), parsed by CLI11's own
// TOML reader, and each item is applied to the parsed command as CLI11 applies config items:
// the option's result added and its callback run.
#include "tools/job_file.h"

#include <algorithm>
#include <sstream>
#include <string>

#include "fsdp/error.h"
#include "io/file_io.h"

namespace fsdp::tools {

namespace {

constexpr uint64_t kMaxJobFileBytes = 1 << 20;

CLI::Option* flag_named(CLI::App& cmd, const std::string& key) {
  std::string dashed = key;
  std::replace(dashed.begin(), dashed.end(), '_', '-');
  for (const std::string& name : {key, dashed})
    if (CLI::Option* opt = cmd.get_option_no_throw("--" + name)) return opt;
  return nullptr;
}

}  // namespace

void add_job_file_option(CLI::App& cmd) {
  cmd.add_option("--config", "a job file (TOML): the flags of this command as keys without their "
                             "dashes (layers = 16); the command line overrides it")
      ->type_name("FILE");
}

void apply_job_file(CLI::App& cmd) {
  const CLI::Option* config = cmd.get_option_no_throw("--config");
  if (config == nullptr || config->count() == 0) return;
  const std::string path = config->as<std::string>();
  std::string text;
  try {
    text = io::read_bounded_file(path, kMaxJobFileBytes, "a job file");
  } catch (const UserError& e) {
    FSDP_USER_FAIL("--config: ", e.what());
  }
  std::istringstream in(text);
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_config(in);
  } catch (const CLI::Error& e) {
    FSDP_USER_FAIL("job file '", path, "': ", e.what());
  }
  for (const CLI::ConfigItem& item : items) {
    // CLI11 marks a section's start and end with "++" and "--" items.
    FSDP_USER_CHECK(item.parents.empty() && item.name != "++" && item.name != "--",
                    "job file '", path, "': sections ([", item.parents.empty() ? item.name
                    : item.parents.front(), "]) are not read; put the flags at the top level");
    CLI::Option* opt = flag_named(cmd, item.name);
    FSDP_USER_CHECK(opt != nullptr && opt != config, "job file '", path, "': '", item.name,
                    "' is not a flag of `fsdp ", cmd.get_name(), "` (see fsdp ", cmd.get_name(),
                    " --help; keys are the flags without their dashes)");
    if (opt->count() > 0) continue;  // the command line's value wins
    try {
      if (opt->get_expected_min() == 0) {  // a flag: true / false
        FSDP_USER_CHECK(item.inputs.size() == 1 &&
                            (item.inputs.front() == "true" || item.inputs.front() == "false"),
                        "job file '", path, "': '", item.name,
                        "' is a flag: give it true or false");
        opt->add_result(opt->get_flag_value(item.name, item.inputs.front()));
      } else {
        opt->add_result(item.inputs);
      }
      opt->run_callback();
    } catch (const CLI::Error& e) {
      FSDP_USER_FAIL("job file '", path, "': ", item.name, ": ", e.what());
    }
  }
}

}  // namespace fsdp::tools
