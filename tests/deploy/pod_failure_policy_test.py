"""Evaluates the agents Job's podFailurePolicy as the Job controller does,
rule by rule in order (the first rule that matches a failed pod decides),
against the failed pods a cluster produces:
  - a node drained or a pod preempted: the pod carries the DisruptionTarget
    condition, and ddprun exits 143 on the SIGTERM (137 when the kubelet
    killed it after the grace period): Ignore (replaced, not counted);
  - the rendezvous did not serve within read_timeout (exit 75): Count
    (retried within backoffLimit);
  - ddprun's own restarts spent (exit 1), or the agent killed with no
    disruption behind it: FailJob, at once.
The Job of deploy/k8s/base and of every overlay's build is checked; the
evaluator itself is checked on the rules in the opposite order, where the
drained pod must fail the Job."""

import glob
import os
import shutil
import subprocess
import sys

import yaml

from deploy_lint import Checker

c = Checker("pod_failure_policy")


def on_exit_codes_match(requirement, pod):
    """As the Job controller: a terminated container (named, if the rule
    names one) whose non-zero exit code the operator accepts. Exit code 0
    never matches."""
    for status in pod["containerStatuses"]:
        terminated = status.get("state", {}).get("terminated")
        if terminated is None or terminated["exitCode"] == 0:
            continue
        if requirement.get("containerName") not in (None, status["name"]):
            continue
        in_values = terminated["exitCode"] in requirement["values"]
        if in_values == (requirement["operator"] == "In"):
            return True
    return False


def on_pod_conditions_match(patterns, pod):
    conditions = {(cond["type"], cond["status"]) for cond in pod.get("conditions", [])}
    return any((p["type"], p.get("status", "True")) in conditions for p in patterns)


def policy_action(rules, pod):
    """The action of the first rule that matches the failed pod, or None
    (no rule: the failure counts against backoffLimit)."""
    for rule in rules:
        if "onExitCodes" in rule and on_exit_codes_match(rule["onExitCodes"], pod):
            return rule["action"]
        if "onPodConditions" in rule and on_pod_conditions_match(rule["onPodConditions"], pod):
            return rule["action"]
    return None


def failed_pod(container, exit_code, disruption=None):
    pod = {"phase": "Failed",
           "containerStatuses": [{"name": container,
                                  "state": {"terminated": {"exitCode": exit_code}}}],
           "conditions": [{"type": "Ready", "status": "False"}]}
    if disruption:
        pod["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                  "reason": disruption})
    return pod


def check_job(job, where):
    rules = job["spec"].get("podFailurePolicy", {}).get("rules", [])
    (container,) = job["spec"]["template"]["spec"]["containers"]
    name = container["name"]
    cases = [
        ("node drained: SIGTERM, ddprun exits 143",
         failed_pod(name, 143, "EvictionByEvictionAPI"), "Ignore"),
        ("pod preempted: ddprun exits 143",
         failed_pod(name, 143, "PreemptionByScheduler"), "Ignore"),
        ("node drained, ddprun killed after the grace period (137)",
         failed_pod(name, 137, "EvictionByEvictionAPI"), "Ignore"),
        ("no rendezvous within read_timeout: exit 75 (EX_TEMPFAIL), retried",
         failed_pod(name, 75), "Count"),
        ("ddprun's restarts spent: exit 1", failed_pod(name, 1), "FailJob"),
        ("ddprun killed with no disruption (143)", failed_pod(name, 143), "FailJob"),
    ]
    for what, pod, expected in cases:
        got = policy_action(rules, pod)
        c.check(got == expected, f"{where}: {what}: the policy says {got}, expected "
                f"{expected} (rules in order: {[r['action'] for r in rules]})")
    return rules, cases


objects = {}
for path in sorted(glob.glob(c.path("deploy", "k8s", "base", "*.yaml"))):
    for doc in c.load_yaml(path):
        objects[(doc.get("kind"), doc.get("metadata", {}).get("name"))] = doc
(job,) = [d for (kind, _), d in objects.items() if kind == "Job"]
rules, cases = check_job(job, "k8s base Job")

# The evaluator takes the order into account: with the exit-code rule first
# (the order before this test) a drained node fails the Job.
drained = cases[0][1]
ignore = [r for r in rules if r["action"] == "Ignore"]
fail = [r for r in rules if r["action"] == "FailJob"]
c.check(policy_action(fail + ignore, drained) == "FailJob" and
        policy_action(ignore + fail, drained) == "Ignore",
        "the evaluator ignores the rules' order")

kubectl = shutil.which("kubectl")
if not kubectl:
    print("FAIL: kubectl not found; apt-get install kubernetes-client "
          "(scripts/setup.sh does): the overlays cannot be built", file=sys.stderr)
    sys.exit(1)
for kustomization in sorted(glob.glob(c.path("deploy", "k8s", "overlays", "*",
                                             "kustomization.yaml"))):
    overlay = os.path.dirname(kustomization)
    run = subprocess.run([kubectl, "kustomize", overlay], capture_output=True,
                         text=True, timeout=60)
    if c.check(run.returncode == 0, f"kubectl kustomize {overlay}: {run.stderr}"):
        (built,) = [d for d in yaml.safe_load_all(run.stdout) if d and d["kind"] == "Job"]
        check_job(built, f"{os.path.basename(overlay)} overlay Job")
c.finish()
