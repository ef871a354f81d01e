// The fsdp command. Note [Errors]: this is the one place that turns an fsdp::Error (or a
// bad flag) into a one-line message and a non-zero exit.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "fsdp/error.h"
#include "tools/export_command.h"
#include "tools/report_command.h"
#include "tools/train_command.h"

int main(int argc, char** argv) {
  CLI::App app{"fsdp: fully sharded data-parallel training (CPU and CUDA backends)"};
  app.require_subcommand(1);
  fsdp::tools::TrainOptions train;
  CLI::App* train_cmd = app.add_subcommand("train", "train a model with FSDP");
  fsdp::tools::add_train_options(*train_cmd, train);
  fsdp::tools::ReportOptions report;
  CLI::App* report_cmd = fsdp::tools::add_report_command(app, report);
  fsdp::tools::ExportOptions export_options;
  CLI::App* export_cmd = fsdp::tools::add_export_command(app, export_options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "fsdp: error: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    if (train_cmd->parsed()) return fsdp::tools::run_train(train);
    if (report_cmd->parsed()) return fsdp::tools::run_report(report);
    if (export_cmd->parsed()) return fsdp::tools::run_export(export_options);
  } catch (const fsdp::Error& e) {
    std::fprintf(stderr, "fsdp: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}
