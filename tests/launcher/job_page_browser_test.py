#!/usr/bin/python3
"""The job's live page in a real headless browser (Debian's chromium).

A ddprun-rendezvous with /metrics and one agent running two ddprun-mnist
workers. The browser loads http://.../jobs/<run_id> from the metrics port,
runs its script for a few seconds of virtual time and dumps the DOM. The
page must show both ranks in the step phase with their step rates, the
round's event, and must have updated: refreshed several times, its
steps-per-second plot holding several points. The page's data
(status.json) must be the job's status with its events; other paths 404.

Under CI=true a missing browser fails the test; elsewhere it is skipped (77).

usage: job_page_browser_test.py --ddprun BIN --rendezvous BIN --mnist BIN
                                --data-dir DIR
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mnist_straggler_test as cluster_lib  # noqa: E402

SKIP = 77
BROWSERS = ("chromium-headless-shell", "chromium")


def fail(what, cluster=None):
    sys.stderr.write("FAIL: %s\n" % what)
    if cluster is not None:
        sys.stderr.write("agent output:\n%s\n" % cluster.agent_output())
    sys.exit(1)


def dump_dom(browser, url, tmp):
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu",
            "--user-data-dir=" + os.path.join(tmp, "profile"),
            "--virtual-time-budget=5000", "--dump-dom", url]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail("%s exited %d: %s" % (browser, r.returncode, r.stderr[-2000:]))
    return r.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--mnist", required=True)
    parser.add_argument("--data-dir", required=True)
    args = parser.parse_args()
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)),
                   None)
    if browser is None:
        if os.environ.get("CI") == "true":
            fail("no headless browser (%s): scripts/setup.sh installs it" %
                 " or ".join(BROWSERS))
        print("skipped: no headless browser")
        return SKIP
    with tempfile.TemporaryDirectory() as tmp:
        cluster = cluster_lib.Cluster(args, tmp, "paged")
        try:
            if not cluster_lib.wait_for(
                    lambda: cluster.stepping_ranks() == {0, 1}, 120):
                fail("the ranks did not report steps", cluster)
            base = cluster.metrics_url.replace("/metrics", "")
            page_url = base + "/jobs/paged"
            dom = dump_dom(browser, page_url, tmp)
            for rank in (0, 1):
                if not re.search(r'<tr class="rank[^"]*" data-rank="%d" '
                                 r'data-phase="step">' % rank, dom):
                    fail("the page shows no rank %d stepping:\n%s" %
                         (rank, dom[-3000:]), cluster)
            refreshes = re.search(r'id="refreshes">(\d+)<', dom)
            if not refreshes or int(refreshes.group(1)) < 3:
                fail("the page did not refresh itself: %s" %
                     (refreshes and refreshes.group(0)), cluster)
            points = re.search(r'<polyline id="rate"[^>]* points="([^"]*)"',
                               dom)
            if not points or len(points.group(1).split()) < 3:
                fail("the steps/s plot did not grow", cluster)
            if "round 0 closed" not in dom:
                fail("the page shows no event", cluster)
            if not re.search(r"\d+\.\d steps/s", dom):
                fail("the page shows no step rate", cluster)
            with urllib.request.urlopen(page_url + "/status.json",
                                        timeout=10) as f:
                status = json.load(f)
            job = status["jobs"][0]
            if job["run_id"] != "paged" or not job["events"]:
                fail("status.json: %s" % json.dumps(job)[:2000], cluster)
            with urllib.request.urlopen(base + "/jobs", timeout=10) as f:
                if 'href="/jobs/paged"' not in f.read().decode():
                    fail("/jobs does not link the job", cluster)
            for missing in ("/jobs/nosuchjob", "/jobs/paged/x", "/other"):
                try:
                    urllib.request.urlopen(base + missing, timeout=10)
                    fail("%s did not 404" % missing, cluster)
                except urllib.error.HTTPError as e:
                    if e.code != 404:
                        fail("%s answered %d" % (missing, e.code), cluster)
            print("page: ranks 0 and 1 stepping, %s refreshes, %d plot "
                  "points" % (refreshes.group(1),
                              len(points.group(1).split())))
        finally:
            cluster.close()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
