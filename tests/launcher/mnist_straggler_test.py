#!/usr/bin/python3
"""A worker throttled for real is named the straggler; a fault-free run names
nobody.

One ddprun agent runs two ddprun-mnist workers against a ddprun-rendezvous
with /metrics. The test itself throttles rank 1 to half speed: a
stop/continue duty cycle (SIGSTOP for 100 ms, SIGCONT for 100 ms). Within
10 s of the throttle's start, `ddprun status --json` must name rank 1 a
straggler (and only it), /metrics must carry its
ddprun_rendezvous_straggler_ratio, and `ddprun status --events --json` a
"straggler" event for it. The same job without the throttle, watched for
as long, must name nobody, in status or in its events. With
`ddprun --straggler-policy replace`, the throttled rank is killed as a
straggler (the failure's cause says so) and replaced in place, and the job
steps on in its next round. The throttled run is repeated with the server
telling the agents to send their figures every 4 s (`--figures-interval
4`: what a job of 1,000 nodes is told at the default --figures-budget):
a rank that slows down sends its figures at once, so it must be named
within the same 10 s.

The agent runs with --hang-bound stopped=0: a worker stopped this often is
otherwise a hang by the default rule (stopped 100 ms), which is right for a
real SIGSTOP but not what this test is about.

usage: mnist_straggler_test.py --ddprun BIN --rendezvous BIN --mnist BIN
                               --data-dir DIR
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from waits import wait_for  # noqa: E402

NAMED_WITHIN_S = 10.0
# Two workers on this 2-core machine: each has a core, so the fault-free
# run's figures differ only by noise.
NPROC = 2
# Steps whose time is mostly compute, as in real training: the seed MLP at
# batch 32 steps in well under a millisecond of compute and spends the rest
# of its step in the gradient sync, so a stop would mostly land in the sync,
# where no rank's figure can tell whose it was.
MODEL_FLAGS = ["--batch-size", "256", "--hidden", "1024"]
WATCH_CLEAN_S = 15.0


class Cluster:
    """A rendezvous server and one agent running MNIST workers."""

    def __init__(self, args, tmp, run_id, agent_flags=(), rdzv_flags=()):
        self.args = args
        self.run_id = run_id
        self.procs = []
        out = open(os.path.join(tmp, run_id + "-rdzv.out"), "w+")
        err = open(os.path.join(tmp, run_id + "-rdzv.err"), "w+")
        self.rdzv = subprocess.Popen(
            [args.rendezvous, "--port", "0", "--metrics-port", "0"] +
            list(rdzv_flags),
            stdout=out, stderr=err, start_new_session=True)
        self.procs.append(self.rdzv)

        def ports():
            err.seek(0)
            out.seek(0)
            m = re.search(r"listening on [^:\s]+:(\d+)", err.read())
            mm = re.search(r"metrics on [^\s]*:(\d+)", out.read())
            return (m.group(1), mm.group(1)) if m and mm else None

        found = wait_for(ports, 30)
        if not found:
            raise RuntimeError("ddprun-rendezvous did not come up")
        self.endpoint = "127.0.0.1:" + found[0]
        self.metrics_url = "http://127.0.0.1:%s/metrics" % found[1]
        self.agent_log = open(os.path.join(tmp, run_id + "-agent.log"), "w+")
        self.agent = subprocess.Popen(
            [args.ddprun, "--nnodes", "1", "--nproc-per-node", str(NPROC),
             "--rdzv-backend", "c10d", "--rdzv-endpoint", self.endpoint,
             "--rdzv-id", run_id, "--hang-bound", "stopped=0"] +
            list(agent_flags) + [args.mnist, "--data-dir", args.data_dir, "--epochs", "100",
             "--save", "", "--test-limit", "100"] + MODEL_FLAGS,
            stdout=self.agent_log, stderr=subprocess.STDOUT,
            start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        self.procs.append(self.agent)

    def status(self, events=False):
        argv = [self.args.ddprun, "status", "--rdzv-endpoint", self.endpoint,
                "--rdzv-id", self.run_id, "--json"]
        if events:
            argv.append("--events")
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return None
        if events:
            return [json.loads(line) for line in r.stdout.splitlines()]
        jobs = json.loads(r.stdout).get("jobs", [])
        return jobs[0] if jobs else None

    def metrics(self):
        with urllib.request.urlopen(self.metrics_url, timeout=10) as f:
            return f.read().decode()

    def stepping_ranks(self):
        """Ranks reported in the step phase with compute figures."""
        job = self.status()
        ranks = set()
        for node in (job or {}).get("nodes", []):
            for r in node.get("ranks", []):
                if r.get("phase") == "step" and r.get("samples", 0) > 0:
                    ranks.add(node.get("rank_offset", 0) +
                              r.get("local_rank", 0))
        return ranks

    def wait_all_stepping(self, timeout_s):
        """Whether every rank reports steps within timeout_s; False at once
        when the agent ends (a bad path, a crash) rather than at the
        deadline."""
        wait_for(lambda: self.agent.poll() is not None or
                 self.stepping_ranks() == set(range(NPROC)), timeout_s)
        return (self.agent.poll() is None and
                self.stepping_ranks() == set(range(NPROC)))

    def worker_pid(self, rank):
        children = open("/proc/%d/task/%d/children" %
                        (self.agent.pid, self.agent.pid)).read().split()
        for pid in map(int, children):
            try:
                env = open("/proc/%d/environ" % pid, "rb").read().split(b"\0")
            except OSError:
                continue
            if b"RANK=%d" % rank in env:
                return pid
        return None

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait(timeout=30)

    def agent_output(self):
        self.agent_log.seek(0)
        return self.agent_log.read()[-4000:]


class Throttle(threading.Thread):
    """SIGSTOP/SIGCONT duty cycle on one process: half its time stopped."""

    def __init__(self, pid, stop_s=0.1, run_s=0.1):
        super().__init__(daemon=True)
        self.pid, self.stop_s, self.run_s = pid, stop_s, run_s
        self.done = threading.Event()

    def run(self):
        try:
            while not self.done.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                time.sleep(self.stop_s)
                os.kill(self.pid, signal.SIGCONT)
                self.done.wait(self.run_s)
        except ProcessLookupError:
            pass
        finally:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def stop(self):
        self.done.set()
        self.join(timeout=5)


def check(condition, what, cluster):
    if not condition:
        sys.stderr.write("FAIL: %s\nagent output:\n%s\n" %
                         (what, cluster.agent_output()))
        sys.exit(1)


def throttled_run(args, tmp, run_id="throttled", figures_interval_s=None):
    rdzv_flags = []
    if figures_interval_s is not None:
        rdzv_flags = ["--figures-interval", str(figures_interval_s)]
    cluster = Cluster(args, tmp, run_id, rdzv_flags=rdzv_flags)
    throttle = None
    try:
        check(cluster.wait_all_stepping(120),
              "the ranks did not all report steps", cluster)
        told = int((cluster.status() or {}).get("figures_interval_ms", 0))
        check(told == int((figures_interval_s or 1) * 1000),
              "the round's figures interval is %d ms" % told, cluster)
        pid = cluster.worker_pid(1)
        check(pid, "no worker with RANK=1 under the agent", cluster)
        throttle = Throttle(pid)
        started = time.monotonic()
        throttle.start()

        def named():
            job = cluster.status()
            return job.get("stragglers") if job else None

        stragglers = wait_for(named, NAMED_WITHIN_S, poll_s=0.25)
        elapsed = time.monotonic() - started
        check(stragglers, "rank 1 was not named within %.0f s" %
              NAMED_WITHIN_S, cluster)
        print("figures every %d ms: named after %.1f s: %s" %
              (told, elapsed, json.dumps(stragglers)))
        check([s.get("rank", 0) for s in stragglers] == [1],
              "the wrong ranks were named: %s" % stragglers, cluster)
        check(stragglers[0]["ratio"] > 1.5, "ratio %s" % stragglers[0],
              cluster)
        metrics = cluster.metrics()
        check(re.search(r'ddprun_rendezvous_straggler_ratio\{run_id="%s",'
                        r'rank="1"\} [0-9.]+' % run_id, metrics),
              "/metrics has no straggler ratio for rank 1", cluster)
        check(re.search(r'ddprun_rendezvous_stragglers\{run_id="%s"\} 1' %
                        run_id, metrics),
              "/metrics does not count 1 straggler", cluster)
        events = cluster.status(events=True)
        check(any(e["kind"] == "straggler" and e["rank"] == 1
                  for e in events), "no straggler event: %s" % events,
              cluster)
        check(cluster.agent.poll() is None, "the agent ended", cluster)
    finally:
        if throttle:
            throttle.stop()
        cluster.close()


def replaced_run(args, tmp):
    """--straggler-policy replace: the named rank is killed and replaced in
    place; the job goes on, the failure's cause says straggler."""
    cluster = Cluster(args, tmp, "replaced",
                      ["--straggler-policy", "replace", "--max-restarts", "1"])
    throttle = None
    try:
        check(cluster.wait_all_stepping(120),
              "the ranks did not all report steps", cluster)
        pid = cluster.worker_pid(1)
        check(pid, "no worker with RANK=1 under the agent", cluster)
        throttle = Throttle(pid)
        throttle.start()

        def replaced():
            job = cluster.status()
            if not job or not job.get("failures"):
                return None
            return job

        job = wait_for(replaced, 60, poll_s=0.25)
        check(job, "the straggler was not replaced", cluster)
        failure = job["failures"][0]
        check(failure.get("failure_cause") == "FAILURE_CAUSE_STRAGGLER" and
              failure.get("rank") == 1, "failure: %s" % failure, cluster)
        throttle.stop()
        check(wait_for(lambda: (cluster.status() or {}).get("round") == "1" and
                       cluster.stepping_ranks() == set(range(NPROC)), 120),
              "the job did not go on in round 1", cluster)
        check(cluster.worker_pid(1) != pid, "rank 1 was not replaced",
              cluster)
        check(cluster.worker_pid(0) is not None, "rank 0 is gone", cluster)
        print("replaced: rank 1 killed as a straggler, round 1 steps")
    finally:
        if throttle:
            throttle.stop()
        cluster.close()


def clean_run(args, tmp):
    cluster = Cluster(args, tmp, "clean")
    try:
        check(cluster.wait_all_stepping(120),
              "the ranks did not all report steps", cluster)
        deadline = time.monotonic() + WATCH_CLEAN_S
        while time.monotonic() < deadline:
            job = cluster.status()
            check(job and not job.get("stragglers"),
                  "a fault-free run named %s" % (job or {}).get("stragglers"),
                  cluster)
            time.sleep(0.25)
        check(cluster.stepping_ranks() == set(range(NPROC)),
              "the ranks stopped stepping while watched", cluster)
        events = cluster.status(events=True)
        check(not any(e["kind"] == "straggler" for e in events),
              "a fault-free run logged a straggler: %s" % events, cluster)
        print("fault-free: nobody named in %.0f s" % WATCH_CLEAN_S)
    finally:
        cluster.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--mnist", required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--only", choices=["throttled", "throttled-4s",
                                           "clean", "replaced"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "throttled"):
            throttled_run(args, tmp)
        if args.only in (None, "throttled-4s"):
            throttled_run(args, tmp, "throttled-4s", figures_interval_s=4)
        if args.only in (None, "clean"):
            clean_run(args, tmp)
        if args.only in (None, "replaced"):
            replaced_run(args, tmp)
    print("PASS")


if __name__ == "__main__":
    main()
