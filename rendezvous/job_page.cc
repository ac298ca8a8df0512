#include "rendezvous/job_page.h"

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

// The live page. Everything it shows comes from status.json, which the
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
const url = location.pathname.replace(/\/+$/, "") + "/status.json";
document.getElementById("run").textContent = runId;
document.getElementById("json").href = url;
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
function median(v) {
  if (!v.length) return 0;
  const s = v.slice().sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]
                      : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}
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
  const state = String(job.state || "").replace("JOB_STATE_", "").toLowerCase();
  const ranks = [];
  for (const node of job.nodes || []) {
    for (const r of node.ranks || []) {
      ranks.push({rank: Number(node.rank_offset) + Number(r.local_rank || 0),
                  node: node.node_id, r: r});
    }
  }
  ranks.sort((a, b) => a.rank - b.rank);
  const named = new Set((job.stragglers || []).map(s => Number(s.rank)));
  const rate = median(ranks.map(x => Number(x.r.steps_per_s || 0)));
  history.push([(Date.now() - opened) / 1000, rate]);
  if (history.length > 600) history.shift();
  document.getElementById("summary").textContent =
      state + ", round " + job.round + ", world size " + job.world_size +
      ", restarts " + job.restart_count + "/" + (job.config || {}).max_restarts +
      ", " + (job.nodes || []).length + " nodes, " + rate.toFixed(1) + " steps/s";
  let html = "<tr>" + cells(["rank", "node", "local", "phase", "steps",
      "steps/s", "compute ms", "p99 ms"], "th") + "</tr>";
  for (const x of ranks) {
    html += '<tr class="rank' + (named.has(x.rank) ? " straggler" : "") +
        '" data-rank="' + x.rank + '" data-phase="' + esc(x.r.phase) + '">' +
        cells([x.rank, x.node, x.r.local_rank || 0, x.r.phase, x.r.steps,
               Number(x.r.steps_per_s || 0).toFixed(1),
               x.r.samples ? ms(x.r.compute_mean_s) : "-",
               x.r.samples ? ms(x.r.compute_p99_s) : "-"], "td") + "</tr>";
  }
  document.getElementById("ranks").innerHTML = html;
  const slow = ranks.filter(x => x.r.samples > 0)
      .sort((a, b) => b.r.compute_mean_s - a.r.compute_mean_s).slice(0, 5);
  html = "<tr>" + cells(["rank", "node", "compute ms", "x median"], "th") + "</tr>";
  const med = Number(job.compute_median_s || 0);
  for (const x of slow) {
    html += "<tr>" + cells([x.rank, x.node, ms(x.r.compute_mean_s),
        med > 0 ? (x.r.compute_mean_s / med).toFixed(2) : "-"], "td") + "</tr>";
  }
  document.getElementById("slowest").innerHTML = html;
  document.getElementById("stragglers").innerHTML = (job.stragglers || [])
      .map(s => '<p class="straggler-note"><b>straggler: rank ' + esc(s.rank) +
           "</b> (" + esc(s.node_id) + "): " + ms(s.compute_s) +
           " ms of compute per step, " + Number(s.ratio).toFixed(2) +
           "x the other ranks' median</p>").join("");
  html = "<tr>" + cells(["time", "round", "kind", "what"], "th") + "</tr>";
  for (const e of (job.events || []).slice().reverse()) {
    html += '<tr class="event">' + cells([
        new Date(Number(e.time_unix_ms)).toISOString().substr(11, 12),
        e.round, e.kind, e.message], "td") + "</tr>";
  }
  document.getElementById("events").innerHTML = html;
  plot();
}
async function refresh() {
  try {
    const response = await fetch(url, {cache: "no-store"});
    const status = await response.json();
    const job = (status.jobs || [])[0];
    if (job) render(job);
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
  absl::ConsumeSuffix(&rest, "/");
  if (rest.empty() || absl::StrContains(rest, '/')) return std::nullopt;
  v1::StatusRequest request;
  request.set_run_id(std::string(rest));
  request.set_events(json);
  absl::StatusOr<v1::StatusResponse> response = status(request);
  if (!response.ok() || response->jobs().empty()) return std::nullopt;
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
