// The fsdp command. Note [Errors]: this is the one place that turns an fsdp::Error (or a
// bad flag) into a one-line message and a non-zero exit. A UserError is bad input and reads
// as a plain sentence; any other Error is a fault of the program and keeps its source location.
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/cuda/cuda_backend.h"
#include "fsdp/error.h"
#include "tools/export_command.h"
#include "tools/generate_command.h"
#include "tools/job_file.h"
#include "tools/prepare_data_command.h"
#include "tools/report_command.h"
#include "tools/simulate_command.h"
#include "tools/train_command.h"

#ifndef FSDP_GIT_COMMIT
#define FSDP_GIT_COMMIT "unknown"
#endif

namespace {

constexpr const char* kVersion = "0.1.0";

// One line, whatever the message holds.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

int fail(const char* kind, const std::string& message, int code) {
  std::fprintf(stderr, "fsdp: %s: %s\n", kind, one_line(message).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp: fully sharded data-parallel training (CPU and CUDA backends)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("fsdp ") + kVersion + " (commit " +
                                        FSDP_GIT_COMMIT + "; " +
                                        fsdp::cuda::build_versions() + ")");
  fsdp::tools::TrainOptions train;
  CLI::App* train_cmd = app.add_subcommand("train", "train a model with FSDP");
  fsdp::tools::add_train_options(*train_cmd, train);
  fsdp::tools::ReportOptions report;
  CLI::App* report_cmd = fsdp::tools::add_report_command(app, report);
  fsdp::tools::ExportOptions export_options;
  CLI::App* export_cmd = fsdp::tools::add_export_command(app, export_options);
  fsdp::tools::SimulateOptions simulate;
  CLI::App* simulate_cmd = fsdp::tools::add_simulate_command(app, simulate);
  fsdp::tools::PrepareDataOptions prepare;
  CLI::App* prepare_cmd = fsdp::tools::add_prepare_data_command(app, prepare);
  fsdp::tools::GenerateCommandOptions generate;
  CLI::App* generate_cmd = fsdp::tools::add_generate_command(app, generate);
  // An unknown first word is an unknown command, said so (CLI11 would call it an extra
  // argument).
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) return fail("error", std::string("unknown command '") + argv[1] +
                                         "' (commands: " + names + ")", 2);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail("error", std::string(e.what()) + " (see --help)", 2);
  }
  try {
    for (CLI::App* cmd : app.get_subcommands()) fsdp::tools::apply_job_file(*cmd);  // --config
    if (train_cmd->parsed()) return fsdp::tools::run_train(train);
    if (report_cmd->parsed()) return fsdp::tools::run_report(report);
    if (simulate_cmd->parsed()) return fsdp::tools::run_simulate(simulate);
    if (prepare_cmd->parsed()) return fsdp::tools::run_prepare_data(prepare);
    if (export_cmd->parsed()) return fsdp::tools::run_export(export_options);
    if (generate_cmd->parsed()) return fsdp::tools::run_generate(generate);
  } catch (const fsdp::Error& e) {
    return fail("error", e.what(), 1);
  } catch (const std::exception& e) {
    return fail("internal error", e.what(), 1);
  }
  return 0;
}
