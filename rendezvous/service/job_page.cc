#include "rendezvous/service/job_page.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/json_string.h"
#include "google/protobuf/util/json_util.h"

namespace ddprun::rendezvous {
namespace {

constexpr char kHtml[] = "text/html; charset=utf-8";

std::string HtmlEscape(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"&", "&amp;"},
                                    {"<", "&lt;"},
                                    {">", "&gt;"},
                                    {"\"", "&quot;"},
                                    {"'", "&#39;"}});
}

// The live page. Everything it shows comes from page.json, which the
// script fetches every second; the steps-per-second history is the page's
// own (it plots what it has seen since it was opened).
constexpr char kJobPage[] = R"html(<!doctype html>
<html><head><meta charset="utf-8"><title>ddprun job @TITLE@</title>
<style>
body{font-family:sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-bottom:1em}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
th{background:#eee} td.l,th.l{text-align:left}
tr.straggler{background:#fdd} .muted{color:#777}
svg{border:1px solid #ccc;background:#fafafa}
</style></head>
<body>
<h1>ddprun job <span id="run"></span></h1>
<p id="summary" class="muted">loading...</p>
<h2>Steps per second</h2>
<svg id="plot" width="640" height="160" viewBox="0 0 640 160"></svg>
<h2>Slowest ranks</h2>
<div id="stragglers"></div>
<table id="slowest"></table>
<h2>Nodes and ranks</h2>
<table id="ranks"></table>
<h2>Failures and events</h2>
<table id="events"></table>
<p class="muted">refreshed <span id="refreshes">0</span> times;
read-only; data: <a id="json" href="">status.json</a></p>
<script>
"use strict";
const runId = @RUN_ID_JSON@;
const url = location.pathname.replace(/\/+$/, "") + "/page.json";
document.getElementById("run").textContent = runId;
document.getElementById("json").href = url.replace("page.json", "status.json");
const history = [];  // [seconds since opened, steps/s]
const opened = Date.now();
let refreshes = 0;
function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;",
      ">": "&gt;", "\"": "&quot;", "'": "&#39;"}[c]));
}
function cells(values, tag) {
  return values.map(v => "<" + tag + ">" + esc(v) + "</" + tag + ">").join("");
}
function ms(s) { return (s * 1000).toFixed(2); }
function plot() {
  const svg = document.getElementById("plot");
  if (history.length < 1) { svg.innerHTML = ""; return; }
  const t0 = history[0][0], t1 = Math.max(history[history.length - 1][0], t0 + 1);
  const top = Math.max(1, ...history.map(p => p[1])) * 1.1;
  const pts = history.map(p => ((p[0] - t0) / (t1 - t0) * 620 + 10).toFixed(1) +
      "," + (150 - p[1] / top * 140).toFixed(1)).join(" ");
  svg.innerHTML = '<polyline id="rate" fill="none" stroke="#36c" stroke-width="2" points="' +
      pts + '"/><text x="12" y="14" font-size="11">' + top.toFixed(0) +
      ' steps/s</text><text x="12" y="156" font-size="11">0</text>';
}
function render(job) {
  const state = String(job.state).replace("JOB_STATE_", "").toLowerCase();
  const named = new Set(job.stragglers.map(s => s.rank));
  history.push([(Date.now() - opened) / 1000, job.steps_per_s]);
  if (history.length > 600) history.shift();
  const phases = Object.entries(job.phases).map(e => e[1] + " " + e[0]).join(", ");
  document.getElementById("summary").textContent =
      state + ", round " + job.round + ", world size " + job.world_size +
      ", restarts " + job.restart_count + "/" + job.max_restarts + ", " +
      job.nodes + " nodes, " + job.steps_per_s.toFixed(1) + " steps/s" +
      (phases ? "; ranks: " + phases : "");
  let html = "<tr>" + cells(["rank", "node", "local", "phase", "steps",
      "steps/s", "compute ms", "p99 ms"], "th") + "</tr>";
  for (const x of job.ranks) {
    html += '<tr class="rank' + (named.has(x.rank) ? " straggler" : "") +
        '" data-rank="' + x.rank + '" data-phase="' + esc(x.phase) + '">' +
        cells([x.rank, x.node, x.local_rank, x.phase, x.steps,
               x.steps_per_s.toFixed(1),
               x.samples ? ms(x.compute_mean_s) : "-",
               x.samples ? ms(x.compute_p99_s) : "-"], "td") + "</tr>";
  }
  if (job.ranks_reported > job.ranks.length) {
    html += '<tr><td colspan="8" class="l muted">and ' +
        (job.ranks_reported - job.ranks.length) + " more ranks</td></tr>";
  }
  document.getElementById("ranks").innerHTML = html;
  html = "<tr>" + cells(["rank", "node", "compute ms", "x median"], "th") + "</tr>";
  const med = job.compute_median_s;
  for (const x of job.slowest) {
    html += "<tr>" + cells([x.rank, x.node, ms(x.compute_mean_s),
        med > 0 ? (x.compute_mean_s / med).toFixed(2) : "-"], "td") + "</tr>";
  }
  document.getElementById("slowest").innerHTML = html;
  document.getElementById("stragglers").innerHTML = job.stragglers
      .map(s => '<p class="straggler-note"><b>straggler: rank ' + esc(s.rank) +
           "</b> (" + esc(s.node) + "): " + ms(s.compute_s) +
           " ms of compute per step, " + s.ratio.toFixed(2) +
           "x the other ranks' median</p>").join("");
  html = "<tr>" + cells(["time", "round", "kind", "what"], "th") + "</tr>";
  for (const e of job.events.slice().reverse()) {
    html += '<tr class="event">' + cells([
        new Date(e.time_unix_ms).toISOString().substr(11, 12),
        e.round, e.kind, e.message], "td") + "</tr>";
  }
  document.getElementById("events").innerHTML = html;
  plot();
}
async function refresh() {
  try {
    const response = await fetch(url, {cache: "no-store"});
    if (response.ok) render(await response.json());
    else document.getElementById("summary").textContent = "no such job";
  } catch (e) {
    document.getElementById("summary").textContent = "server unreachable: " + e;
  }
  document.getElementById("refreshes").textContent = ++refreshes;
}
refresh();
setInterval(refresh, 1000);
</script></body></html>
)html";

// The ranks the page lists in full; a larger job shows the first ones, and
// every rank counts in the phases, the rate and the slowest list.
constexpr int kRanksShown = 64;
constexpr int kSlowestShown = 8;
constexpr int kEventsShown = 100;

void AppendField(std::string& out, absl::string_view name,
                 absl::string_view text) {
  common::AppendJsonString(out, name);
  out += ':';
  common::AppendJsonString(out, text);
  out += ',';
}

template <typename Number>
void AppendNumber(std::string& out, absl::string_view name, Number value) {
  common::AppendJsonString(out, name);
  absl::StrAppend(&out, ":", value, ",");
}

struct RankRow {
  int rank;
  const std::string* node_id;
  const v1::RankFigures* figures;
};

void AppendRank(std::string& out, const RankRow& row) {
  out += '{';
  AppendNumber(out, "rank", row.rank);
  AppendField(out, "node", *row.node_id);
  AppendNumber(out, "local_rank", row.figures->local_rank());
  AppendField(out, "phase", row.figures->phase());
  AppendNumber(out, "steps", row.figures->steps());
  AppendNumber(out, "steps_per_s", row.figures->steps_per_s());
  AppendNumber(out, "samples", row.figures->samples());
  AppendNumber(out, "compute_mean_s", row.figures->compute_mean_s());
  AppendNumber(out, "compute_p99_s", row.figures->compute_p99_s());
  out.back() = '}';
}

// What the page shows, and no more: a page of a 1,000-node job polls this
// every second, so it is bounded (kRanksShown, kSlowestShown,
// kEventsShown) and written directly, not through protobuf's JSON printer
// (the whole status of 8,000 ranks is ~1.4 MB and ~40 ms of a core).
std::string PageJson(const v1::JobStatus& job) {
  std::vector<RankRow> rows;
  for (const v1::NodeStatus& node : job.nodes()) {
    for (const v1::RankFigures& r : node.ranks()) {
      rows.push_back(
          {node.rank_offset() + r.local_rank(), &node.node_id(), &r});
    }
  }
  std::sort(rows.begin(), rows.end(),
            [](const RankRow& a, const RankRow& b) { return a.rank < b.rank; });
  std::vector<double> rates;
  rates.reserve(rows.size());
  absl::flat_hash_map<std::string, int> phases;
  for (const RankRow& row : rows) {
    rates.push_back(row.figures->steps_per_s());
    ++phases[row.figures->phase()];
  }
  double rate = 0;
  if (!rates.empty()) {
    std::nth_element(rates.begin(), rates.begin() + rates.size() / 2,
                     rates.end());
    rate = rates[rates.size() / 2];
  }
  std::vector<RankRow> slowest;
  for (const RankRow& row : rows) {
    if (row.figures->samples() > 0) slowest.push_back(row);
  }
  const size_t n_slow = std::min<size_t>(kSlowestShown, slowest.size());
  std::partial_sort(slowest.begin(), slowest.begin() + n_slow, slowest.end(),
                    [](const RankRow& a, const RankRow& b) {
                      return a.figures->compute_mean_s() >
                             b.figures->compute_mean_s();
                    });
  slowest.resize(n_slow);

  std::string out = "{";
  AppendField(out, "run_id", job.run_id());
  AppendField(out, "state", v1::JobState_Name(job.state()));
  AppendNumber(out, "round", job.round());
  AppendNumber(out, "world_size", job.world_size());
  AppendNumber(out, "restart_count", job.restart_count());
  AppendNumber(out, "max_restarts", job.config().max_restarts());
  AppendNumber(out, "nodes", job.nodes_size());
  AppendNumber(out, "ranks_reported", rows.size());
  AppendNumber(out, "steps_per_s", rate);
  AppendNumber(out, "compute_median_s", job.compute_median_s());
  out += "\"phases\":{";
  for (const auto& [phase, count] : phases) {
    common::AppendJsonString(out, phase);
    absl::StrAppend(&out, ":", count, ",");
  }
  if (out.back() == ',') out.pop_back();
  out += "},\"stragglers\":[";
  for (const v1::Straggler& s : job.stragglers()) {
    out += '{';
    AppendNumber(out, "rank", s.rank());
    AppendField(out, "node", s.node_id());
    AppendNumber(out, "compute_s", s.compute_s());
    AppendNumber(out, "job_median_s", s.job_median_s());
    AppendNumber(out, "ratio", s.ratio());
    out.back() = '}';
    out += ',';
  }
  if (out.back() == ',') out.pop_back();
  out += "],\"slowest\":[";
  for (const RankRow& row : slowest) {
    AppendRank(out, row);
    out += ',';
  }
  if (out.back() == ',') out.pop_back();
  out += "],\"ranks\":[";
  for (size_t i = 0; i < rows.size() && i < kRanksShown; ++i) {
    AppendRank(out, rows[i]);
    out += ',';
  }
  if (out.back() == ',') out.pop_back();
  out += "],\"events\":[";
  const int first_event = std::max(0, job.events_size() - kEventsShown);
  for (int i = first_event; i < job.events_size(); ++i) {
    const v1::JobEvent& e = job.events(i);
    out += '{';
    AppendNumber(out, "time_unix_ms", e.time_unix_ms());
    AppendField(out, "kind", e.kind());
    AppendNumber(out, "round", e.round());
    AppendNumber(out, "rank", e.rank());
    AppendField(out, "message", e.message());
    out.back() = '}';
    out += ',';
  }
  if (out.back() == ',') out.pop_back();
  out += "]}";
  return out;
}

std::string IndexPage(const v1::StatusResponse& status) {
  std::string html =
      "<!doctype html><html><head><meta charset=\"utf-8\"><title>ddprun "
      "jobs</title></head><body><h1>ddprun jobs</h1><ul>";
  for (const v1::JobStatus& job : status.jobs()) {
    absl::StrAppend(&html, "<li><a href=\"/jobs/", HtmlEscape(job.run_id()),
                    "\">", HtmlEscape(job.run_id()), "</a> ",
                    HtmlEscape(v1::JobState_Name(job.state())), "</li>");
  }
  absl::StrAppend(&html, "</ul></body></html>\n");
  return html;
}

}  // namespace

std::optional<common::HttpPage> JobPage(const std::string& target,
                                        const StatusSource& status) {
  absl::string_view rest = target;
  if (rest == "/jobs" || rest == "/jobs/") {
    absl::StatusOr<v1::StatusResponse> all = status(v1::StatusRequest());
    if (!all.ok()) return std::nullopt;
    return common::HttpPage{kHtml, IndexPage(*all)};
  }
  if (!absl::ConsumePrefix(&rest, "/jobs/")) return std::nullopt;
  const bool json = absl::ConsumeSuffix(&rest, "/status.json");
  const bool page_json = !json && absl::ConsumeSuffix(&rest, "/page.json");
  absl::ConsumeSuffix(&rest, "/");
  if (rest.empty() || absl::StrContains(rest, '/')) return std::nullopt;
  v1::StatusRequest request;
  request.set_run_id(std::string(rest));
  request.set_events(json || page_json);
  absl::StatusOr<v1::StatusResponse> response = status(request);
  if (!response.ok() || response->jobs().empty()) return std::nullopt;
  if (page_json) {
    return common::HttpPage{"application/json", PageJson(response->jobs(0))};
  }
  if (json) {
    std::string body;
    google::protobuf::util::JsonPrintOptions print;
    print.preserve_proto_field_names = true;
    print.always_print_primitive_fields = true;
    if (!google::protobuf::util::MessageToJsonString(*response, &body, print)
             .ok()) {
      return std::nullopt;
    }
    return common::HttpPage{"application/json", std::move(body)};
  }
  std::string run_id_json;
  common::AppendJsonString(run_id_json, rest);
  // "</" cannot end the script early inside the JSON string.
  run_id_json = absl::StrReplaceAll(run_id_json, {{"</", "<\\/"}});
  return common::HttpPage{
      kHtml, absl::StrReplaceAll(kJobPage, {{"@TITLE@", HtmlEscape(rest)},
                                            {"@RUN_ID_JSON@", run_id_json}})};
}

}  // namespace ddprun::rendezvous
