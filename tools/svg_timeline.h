// One step of one rank's timeline as an SVG picture: a row per track (host, compute,
// all-gather, reduce-scatter, others), ops as bars coloured by what they are, the compute
// stream's waits on communication in red with what they waited for, a memory row and a time
// axis in ms. Meant to be looked at before the numbers.
#pragma once

#include <string>

#include "fsdp/device.h"
#include "runtime/trace_metrics.h"

namespace fsdp::tools {

struct SvgTimelineOptions {
  double width_px = 1600;
  int max_stall_labels = 12;  // the longest stalls get a text label; every stall is red
};

// `title` is the first line of the picture (e.g. "rank 0, step 3 of 3"); the second line
// states the step's own numbers. The SVG is self-contained and well-formed XML.
std::string render_step_svg(const Timeline& t, const runtime::StepWindow& step,
                            const std::string& title, const SvgTimelineOptions& options = {});

// Text made safe for XML character data and attribute values.
std::string xml_escape(const std::string& text);

}  // namespace fsdp::tools
