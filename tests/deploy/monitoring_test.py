#!/usr/bin/python3
"""deploy/monitoring's Grafana dashboard and ServiceMonitor against what the
server really exports.

Every metric name the dashboard's queries use must be a family a real
ddprun-rendezvous /metrics declares (# TYPE; a histogram's _bucket, _sum and
_count belong to it), and every label the queries select on or group by must
be one of that family's labels in a scrape taken while a job runs. The
ServiceMonitor must scrape the Service port and path that
deploy/k8s/overlays/metrics exposes, and select the base Service's labels.

usage: monitoring_test.py --source-dir DIR --ddprun BIN --rendezvous BIN
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from waits import wait_for  # noqa: E402


def fail(what):
    sys.stderr.write("FAIL: %s\n" % what)
    sys.exit(1)


def scrape_running_server(args, tmp):
    """Families (name -> type) and the label names seen per family."""
    out = open(os.path.join(tmp, "out"), "w+")
    rdzv = subprocess.Popen([args.rendezvous, "--port", "0",
                             "--metrics-port", "0"], stdout=out,
                            stderr=subprocess.DEVNULL)
    agent = None
    try:
        def lines():
            out.seek(0)
            text = out.read()
            m = re.search(r"listening on (\S+)", text)
            mm = re.search(r"metrics on (\S+)", text)
            return (m.group(1), mm.group(1)) if m and mm else None
        found = wait_for(lines, 30)
        if not found:
            fail("ddprun-rendezvous did not come up")
        endpoint, url = found
        # A job whose one worker sleeps: jobs, rounds and nodes exist.
        agent = subprocess.Popen(
            [args.ddprun, "--nnodes", "1", "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
             "--rdzv-id", "dash", "/bin/sleep", "60"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def body():
            with urllib.request.urlopen(url, timeout=5) as f:
                text = f.read().decode()
            return text if 'ddprun_rendezvous_round{run_id="dash"}' in text \
                else None
        text = wait_for(body, 60)
        if not text:
            fail("the job never showed in /metrics")
    finally:
        for p in (agent, rdzv):
            if p is not None:
                p.kill()
                p.wait(timeout=30)
    types, labels = {}, {}
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            types[m.group(1)] = m.group(2)
            labels.setdefault(m.group(1), set())
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", line)
        if m:
            family = re.sub(r"_(bucket|sum|count)$", "", m.group(1)) \
                if re.sub(r"_(bucket|sum|count)$", "", m.group(1)) in types \
                else m.group(1)
            labels.setdefault(family, set()).update(
                re.findall(r"([a-zA-Z_]+)=\"", m.group(2)))
    return types, labels


def check_dashboard(path, types, labels):
    dash = json.load(open(path))
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for v in dash.get("templating", {}).get("list", []):
        if isinstance(v.get("query"), str) and "ddprun_" in v["query"]:
            exprs.append(v["query"])
    if not exprs:
        fail("the dashboard has no queries")
    used = set()
    for expr in exprs:
        for name in re.findall(r"\bddprun_[a-z0-9_]+", expr):
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            if name not in types and not (family in types and
                                          types[family] == "histogram"):
                fail("the dashboard queries %s, which the server does not "
                     "export (exported: %s)" % (name, sorted(types)))
            used.add(name if name in types else family)
        # Labels selected on or grouped by must exist on the queried family.
        for name, selector in re.findall(r"(ddprun_[a-z0-9_]+)\{([^}]*)\}",
                                         expr):
            family = name if name in types else re.sub(
                r"_(bucket|sum|count)$", "", name)
            for label in re.findall(r"([a-z_]+)\s*=~?", selector):
                if labels.get(family) and label not in labels[family]:
                    fail("%s has no label %s (it has %s)" %
                         (family, label, sorted(labels[family])))
    for needed in ("ddprun_rendezvous_stragglers",
                   "ddprun_rendezvous_straggler_ratio",
                   "ddprun_rendezvous_steps_per_second"):
        if needed not in used:
            fail("the dashboard does not show %s" % needed)
    return used


def check_servicemonitor(source):
    sm = yaml.safe_load(open(os.path.join(
        source, "deploy/monitoring/servicemonitor.yaml")))
    if sm["kind"] != "ServiceMonitor" or \
            sm["apiVersion"] != "monitoring.coreos.com/v1":
        fail("servicemonitor.yaml is no ServiceMonitor")
    service = yaml.safe_load(open(os.path.join(
        source, "deploy/k8s/base/rendezvous-service.yaml")))
    wanted = sm["spec"]["selector"]["matchLabels"]
    have = service["metadata"].get("labels", {})
    if any(have.get(k) != v for k, v in wanted.items()):
        fail("the ServiceMonitor selects %s; the Service has %s" %
             (wanted, have))
    patch = yaml.safe_load(open(os.path.join(
        source, "deploy/k8s/overlays/metrics/service-metrics.yaml")))
    port_names = {op["value"]["name"] for op in patch if op["op"] == "add"}
    for endpoint in sm["spec"]["endpoints"]:
        if endpoint["port"] not in port_names:
            fail("the ServiceMonitor scrapes port %s; the overlay adds %s" %
                 (endpoint["port"], port_names))
        if endpoint.get("path", "/metrics") != "/metrics":
            fail("the ServiceMonitor scrapes %s" % endpoint["path"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--rendezvous", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        types, labels = scrape_running_server(args, tmp)
    used = check_dashboard(os.path.join(
        args.source_dir, "deploy/monitoring/grafana-dashboard.json"),
        types, labels)
    check_servicemonitor(args.source_dir)
    print("dashboard: %d metric families, all exported; ServiceMonitor "
          "matches the Service" % len(used))
    print("PASS")


if __name__ == "__main__":
    main()
