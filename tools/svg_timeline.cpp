// The SVG step picture of `fsdp report --svg`. Layout, top to bottom: title, the step's
// numbers, legend, the stall labels, one row per track, the memory row, the time axis.
#include "svg_timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "fsdp/error.h"

namespace fsdp::tools {

namespace {

using runtime::starts_with;

enum class Category {
  Compute,
  AllGather,
  ReduceScatter,
  Copy,
  Optimizer,
  Collective,
  Host,
  Wait,
  Stall
};

struct CategoryStyle {
  const char* legend;
  const char* fill;
  const char* text;  // label colour inside the bar, readable on `fill`
};
constexpr CategoryStyle kStyles[] = {
    {"compute (gemm, activation, loss)", "#4e79a7", "#ffffff"},
    {"all-gather", "#59a14f", "#ffffff"},
    {"reduce-scatter (+ accumulate)", "#f28e2b", "#000000"},
    {"copy (AG/RS copy-in/out, uploads)", "#edc948", "#000000"},
    {"optimizer, zero_grad", "#b07aa1", "#ffffff"},
    {"other collective", "#76b7b2", "#000000"},
    {"host scheduling", "#9c755f", "#ffffff"},
    {"stream blocked in a wait", "#c8c8c8", "#000000"},
    {"compute stalled on communication", "#e15759", "#ffffff"},
};
const CategoryStyle& style(Category c) {
  return kStyles[static_cast<int>(c)];
}

Category category_of(const TimelineOp& op) {
  if (op.kind == OpKind::Wait) return Category::Wait;
  if (op.kind == OpKind::Host) return Category::Host;
  if (op.kind == OpKind::Optimizer) return Category::Optimizer;
  if (op.kind == OpKind::Copy || starts_with(op.label, "AG copy-") ||
      starts_with(op.label, "RS copy-in "))
    return Category::Copy;
  if (op.label == "optimizer" || op.label == "zero_grad") return Category::Optimizer;
  if (starts_with(op.label, "AG ")) return Category::AllGather;
  if (starts_with(op.label, "RS ")) return Category::ReduceScatter;
  if (op.kind == OpKind::Collective) return Category::Collective;
  return Category::Compute;
}

// Host first, then the streams people look at first; the rest in creation order.
int row_order(const Timeline& t, int stream) {
  if (stream < 0) return 0;
  const std::string& name =
      stream < static_cast<int>(t.stream_names.size()) ? t.stream_names[stream] : "";
  if (name == "compute") return 1;
  if (name == "all-gather") return 2;
  if (name == "reduce-scatter") return 3;
  return 4 + stream;
}

std::string track_name(const Timeline& t, int stream) {
  if (stream < 0) return "host";
  if (stream < static_cast<int>(t.stream_names.size()) && !t.stream_names[stream].empty())
    return t.stream_names[stream];
  return "stream " + std::to_string(stream);
}

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// Sans-serif averages a little over half an em per character; over-estimating keeps labels
// inside their bars.
double text_width(const std::string& s, double font_px) {
  return 0.6 * font_px * s.size();
}

// A multiple of 1, 2 or 5 times a power of ten near range / target_ticks.
double nice_tick(double range, int target_ticks) {
  const double raw = range / std::max(target_ticks, 1);
  if (raw <= 0) return 1;
  const double base = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * base) return m * base;
  return 10 * base;
}

class SvgBuilder {
 public:
  void rect(double x, double y, double w, double h, const char* fill, const std::string& tooltip) {
    body_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" +
             num(h) + "\" fill=\"" + fill + "\"";
    if (tooltip.empty()) {
      body_ += "/>\n";
    } else {
      body_ += "><title>" + xml_escape(tooltip) + "</title></rect>\n";
    }
  }
  void text(double x, double y, const std::string& s, double size, const char* fill = "#222222",
            const char* anchor = "start", const char* weight = "normal") {
    body_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" font-size=\"" + num(size) +
             "\" fill=\"" + fill + "\" text-anchor=\"" + anchor + "\" font-weight=\"" + weight +
             "\">" + xml_escape(s) + "</text>\n";
  }
  void line(double x1, double y1, double x2, double y2, const char* stroke, double width) {
    body_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
             num(y2) + "\" stroke=\"" + stroke + "\" stroke-width=\"" + num(width) + "\"/>\n";
  }
  void polyline(const std::vector<std::pair<double, double>>& points, const char* stroke) {
    body_ += "<polyline fill=\"none\" stroke=\"" + std::string(stroke) +
             "\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : points) body_ += num(x) + "," + num(y) + " ";
    body_ += "\"/>\n";
  }
  std::string finish(double width, double height) const {
    return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
           "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
           num(width) + "\" height=\"" + num(height) + "\" viewBox=\"0 0 " + num(width) + " " +
           num(height) +
           "\" font-family=\"Helvetica, Arial, sans-serif\">\n"
           "<rect x=\"0\" y=\"0\" width=\"" +
           num(width) + "\" height=\"" + num(height) + "\" fill=\"#ffffff\"/>\n" + body_ +
           "</svg>\n";
  }

 private:
  static std::string num(double v) { return fmt("%.1f", v); }
  std::string body_;
};

struct Layout {
  double width = 0, left = 170, right = 24;
  double start_us = 0, end_us = 0;
  double plot_width() const { return width - left - right; }
  double x(double t_us) const {
    return left + (t_us - start_us) / std::max(end_us - start_us, 1e-9) * plot_width();
  }
};

constexpr double kRowHeight = 28, kBarHeight = 20, kLaneHeight = 15, kMemoryRowHeight = 56;

// Legend entries flow left to right and wrap; returns the y below the legend.
double draw_legend(SvgBuilder& svg, const Layout& L, double y) {
  double x = L.left;
  for (int c = 0; c <= static_cast<int>(Category::Stall); ++c) {
    const CategoryStyle& s = kStyles[c];
    const double w = 18 + text_width(s.legend, 11) + 18;
    if (x + w > L.width - L.right) {
      x = L.left;
      y += 18;
    }
    svg.rect(x, y - 10, 12, 12, s.fill, "");
    svg.text(x + 17, y, s.legend, 11);
    x += w;
  }
  return y + 12;
}

struct PlacedLabel {
  int lane = 0;
  double text_x = 0, anchor_x = 0;
  std::string text;
};

// The longest stalls first: each takes the highest lane where it does not overlap a label
// already placed; those that fit nowhere stay unlabelled (still red, with a tooltip).
std::vector<PlacedLabel> place_stall_labels(const std::vector<runtime::Stall>& stalls,
                                            const Layout& L, int max_labels, int max_lanes) {
  std::vector<const runtime::Stall*> order;
  const double window_ms = (L.end_us - L.start_us) * 1e-3;
  for (const runtime::Stall& s : stalls)
    if (s.on_comm() && s.ms() >= 0.005 * window_ms) order.push_back(&s);
  std::stable_sort(
      order.begin(), order.end(),
      [](const runtime::Stall* a, const runtime::Stall* b) { return a->ms() > b->ms(); });
  std::vector<std::vector<std::pair<double, double>>> taken(max_lanes);
  std::vector<PlacedLabel> placed;
  for (const runtime::Stall* s : order) {
    if (static_cast<int>(placed.size()) >= max_labels) break;
    PlacedLabel p;
    p.text = fmt("%.2f ms ", s->ms()) + s->waited_for;
    p.anchor_x = 0.5 * (L.x(s->start_us) + L.x(s->end_us));
    const double w = text_width(p.text, 10);
    p.text_x = std::clamp(p.anchor_x - w / 2, L.left, L.width - L.right - w);
    for (int lane = 0; lane < max_lanes; ++lane) {
      const bool clash = std::any_of(taken[lane].begin(), taken[lane].end(), [&](auto span) {
        return p.text_x < span.second + 6 && span.first < p.text_x + w + 6;
      });
      if (clash) continue;
      taken[lane].push_back({p.text_x, p.text_x + w});
      p.lane = lane;
      placed.push_back(p);
      break;
    }
  }
  return placed;
}

std::string tooltip_of(const TimelineOp& op, double step_start_us) {
  static const char* kinds[] = {"kernel", "copy", "collective", "wait", "optimizer", "host"};
  const std::string what = op.kind != OpKind::Wait ? op.label
                           : op.waited_for.empty() ? std::string("wait")
                                                   : "wait for " + op.waited_for;
  return what + " (" + kinds[static_cast<int>(op.kind)] + ") at " +
         fmt("%.3f", (op.start_us - step_start_us) * 1e-3) + " ms, " +
         fmt("%.3f", std::max(0.0, op.end_us - op.start_us) * 1e-3) + " ms";
}

void draw_memory_row(SvgBuilder& svg, const Layout& L, const Timeline& t, double y) {
  std::vector<std::pair<double, int64_t>> samples;  // the value at the window start, then changes
  int64_t before = -1;
  for (const MemSample& m : t.memory) {
    if (m.time_us < L.start_us)
      before = m.bytes;
    else if (m.time_us <= L.end_us)
      samples.push_back({m.time_us, m.bytes});
  }
  if (before >= 0) samples.insert(samples.begin(), {L.start_us, before});
  if (samples.empty()) return;
  int64_t peak = 1;
  for (const auto& s : samples) peak = std::max(peak, s.second);
  const double top = y + 6, bottom = y + kMemoryRowHeight - 6;
  auto ypos = [&](int64_t b) { return bottom - (bottom - top) * static_cast<double>(b) / peak; };
  std::vector<std::pair<double, double>> points;
  for (size_t i = 0; i < samples.size(); ++i) {
    const double x = L.x(samples[i].first);
    if (i > 0) points.push_back({x, ypos(samples[i - 1].second)});  // a step, not a slope
    points.push_back({x, ypos(samples[i].second)});
  }
  points.push_back({L.x(L.end_us), ypos(samples.back().second)});
  svg.text(L.left - 8, y + 24, "allocated", 12, "#222222", "end", "bold");
  svg.text(L.left - 8, y + 40, "max " + fmt("%.2f", peak / 1048576.0) + " MiB", 10, "#555555",
           "end");
  svg.line(L.left, bottom, L.width - L.right, bottom, "#bbbbbb", 1);
  svg.polyline(points, "#333333");
}

double draw_axis(SvgBuilder& svg, const Layout& L, double rows_top, double y) {
  const double range_ms = (L.end_us - L.start_us) * 1e-3;
  const double tick = nice_tick(range_ms, 12);
  svg.line(L.left, y, L.width - L.right, y, "#333333", 1);
  for (int i = 0; i * tick <= range_ms + 1e-9; ++i) {
    const double x = L.x(L.start_us + i * tick * 1e3);
    svg.line(x, rows_top, x, y, "#e4e4e4", 1);
    svg.line(x, y, x, y + 5, "#333333", 1);
    svg.text(x, y + 18,
             fmt(tick < 0.1 ? "%.3f"
                 : tick < 1 ? "%.2f"
                            : "%.0f",
                 i * tick),
             11, "#222222", "middle");
  }
  svg.text(L.width - L.right, y + 34, "time in the step (ms)", 11, "#222222", "end");
  return y + 44;
}

}  // namespace

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // XML 1.0 forbids most control characters even when escaped.
        out +=
            (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') ? '?' : c;
    }
  }
  return out;
}

std::string render_step_svg(const Timeline& t, const runtime::StepWindow& step,
                            const std::string& title, const SvgTimelineOptions& options) {
  FSDP_CHECK(step.end_us > step.start_us, "step ", step.index, " has no length (", step.start_us,
             " .. ", step.end_us, " us)");
  FSDP_CHECK(options.width_px >= 400, "the SVG needs at least 400 px, got ", options.width_px);
  Layout L;
  L.width = options.width_px;
  L.start_us = step.start_us;
  L.end_us = step.end_us;
  const int compute = runtime::find_stream(t, "compute");

  // The step on its own: ops clipped to the window, measured as one step.
  Timeline clipped;
  clipped.stream_names = t.stream_names;
  for (const TimelineOp& op : t.ops) {
    // Ops that only touch the window's edges belong to the neighbouring step.
    const bool inside = op.start_us < L.end_us && op.end_us > L.start_us;
    const bool instant_inside =
        op.start_us == op.end_us && op.start_us >= L.start_us && op.start_us < L.end_us;
    if (!inside && !instant_inside) continue;
    TimelineOp c = op;
    c.start_us = std::max(c.start_us, L.start_us);
    c.end_us = std::min(c.end_us, L.end_us);
    clipped.ops.push_back(std::move(c));
  }
  std::vector<runtime::Stall> stalls;
  runtime::TimelineMetrics m;
  if (compute >= 0) {
    m = runtime::compute_metrics(clipped, compute, 1.0, 0);
    stalls = runtime::find_stalls(clipped, compute);
  }

  std::set<int> streams;
  for (const TimelineOp& op : clipped.ops) streams.insert(op.stream);
  if (compute >= 0) streams.insert(compute);
  std::vector<int> rows(streams.begin(), streams.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [&](int a, int b) { return row_order(t, a) < row_order(t, b); });

  SvgBuilder svg;
  svg.text(L.left, 26, title, 17, "#111111", "start", "bold");
  std::string numbers = fmt("step %.2f ms", (L.end_us - L.start_us) * 1e-3);
  if (compute >= 0)
    numbers += fmt("  |  compute stalled on comm %.3f ms", m.exposed_comm_ms) +
               fmt(" (all-gather %.3f", m.exposed_ag_ms) +
               fmt(", RS ring %.3f", m.rs_recycle_stall_ms) +
               fmt(", RS drain %.3f", m.rs_drain_ms) + fmt(", other %.3f)", m.other_comm_ms) +
               fmt("  |  AG/RS overlap %.3f ms", m.ag_rs_overlap_ms) + "  |  " +
               std::to_string(clipped.ops.size()) + " ops";
  svg.text(L.left, 46, numbers, 12, "#333333");
  double y = draw_legend(svg, L, 70) + 8;

  constexpr int kLanes = 4;
  const std::vector<PlacedLabel> labels =
      place_stall_labels(stalls, L, options.max_stall_labels, kLanes);
  int lanes_used = 0;
  for (const PlacedLabel& p : labels) lanes_used = std::max(lanes_used, p.lane + 1);
  const double lanes_top = y;
  if (lanes_used > 0) {
    svg.text(L.left - 8, lanes_top + 12, "stalls", 12, style(Category::Stall).fill, "end", "bold");
    y += lanes_used * kLaneHeight + 6;
  }
  const double rows_top = y;
  std::map<int, double> row_y;
  for (size_t i = 0; i < rows.size(); ++i) row_y[rows[i]] = rows_top + i * kRowHeight;
  const double rows_bottom = rows_top + rows.size() * kRowHeight;
  const bool has_memory = !t.memory.empty();
  const double axis_y = rows_bottom + (has_memory ? kMemoryRowHeight : 0) + 8;

  // Backgrounds and grid first so the bars draw over them.
  for (size_t i = 0; i < rows.size(); ++i) {
    const double ry = row_y[rows[i]];
    svg.rect(L.left, ry, L.plot_width(), kRowHeight, i % 2 ? "#ffffff" : "#f4f4f4", "");
    svg.text(L.left - 8, ry + kRowHeight / 2 + 4.5, track_name(t, rows[i]), 12, "#222222", "end",
             rows[i] == compute ? "bold" : "normal");
  }
  const double axis_end = draw_axis(svg, L, rows_top, axis_y);

  std::set<std::pair<double, double>> comm_stalls;  // the compute waits to draw in red
  for (const runtime::Stall& s : stalls)
    if (s.on_comm()) comm_stalls.insert({s.start_us, s.end_us});
  for (const TimelineOp& op : clipped.ops) {
    const double x0 = L.x(op.start_us), x1 = L.x(op.end_us);
    const double ry = row_y[op.stream];
    Category c = category_of(op);
    if (op.stream == compute && c == Category::Wait && comm_stalls.count({op.start_us, op.end_us}))
      c = Category::Stall;
    if (c == Category::Wait) {
      // Blocked, not busy: a thin bar so busy work stands out.
      if (x1 - x0 >= 0.5)
        svg.rect(x0, ry + kRowHeight / 2 - 3, x1 - x0, 6, style(c).fill,
                 tooltip_of(op, L.start_us));
      continue;
    }
    const double w = std::max(x1 - x0, c == Category::Stall ? 1.5 : 0.6);
    svg.rect(x0, ry + (kRowHeight - kBarHeight) / 2, w, kBarHeight, style(c).fill,
             tooltip_of(op, L.start_us));
    const std::string& text = c == Category::Stall ? op.waited_for : op.label;
    if (w >= text_width(text, 10) + 6)
      svg.text(x0 + 3, ry + kRowHeight / 2 + 3.5, text, 10, style(c).text);
  }

  for (const PlacedLabel& p : labels) {
    const double text_y = lanes_top + (p.lane + 1) * kLaneHeight - 3;
    svg.line(p.anchor_x, text_y + 3, p.anchor_x, row_y[compute] + (kRowHeight - kBarHeight) / 2,
             style(Category::Stall).fill, 1);
    svg.text(p.text_x, text_y, p.text, 10, style(Category::Stall).fill, "start", "bold");
  }
  if (has_memory) draw_memory_row(svg, L, t, rows_bottom);
  svg.text(L.left, axis_end + 6,
           "t = 0 at the step's start (where the previous step's optimizer ended). Red: the "
           "compute stream waiting "
           "for an all-gather or reduce-scatter. Hover a bar for its label and duration.",
           11, "#555555");
  return svg.finish(L.width, axis_end + 20);
}

}  // namespace fsdp::tools
