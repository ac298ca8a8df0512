"""Evaluates each Job's podFailurePolicy as the Job controller does, rule by
rule in order (the first rule that matches a failed pod decides), against the
failed pods a cluster produces:
  - a node drained or a pod preempted: the pod carries the DisruptionTarget
    condition, and ddprun exits on the SIGTERM with the code its command line
    asks for (1, torchrun's, by default; 143 with --signal-exit-code shell),
    or 137 when the kubelet killed it after the grace period: Ignore
    (replaced, not counted);
  - the rendezvous did not serve within read_timeout (exit 75): Count
    (retried within backoffLimit);
  - ddprun's own restarts spent (exit 1), or the agent stopped with no
    disruption behind it: FailJob, at once.
The exit code on SIGTERM is the real one: when ddprun is built, it is
started with the container's command line's --signal-exit-code (or
PET_SIGNAL_EXIT_CODE) and sent SIGTERM; when it is not, the documented
codes are used.
The Jobs checked: deploy/k8s/base's, every overlay's build, and the Job
templates of the JobSet and Trainer v2 examples. The evaluator itself is
checked on the rules in the opposite order, where the drained pod must fail
the Job."""

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import yaml

from deploy_lint import Checker

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
from waits import wait_for  # noqa: E402

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


def signal_exit_mode(container):
    """What the container's ddprun exits with on a stop signal: "shell"
    (128 + signal) or "torchrun" (1, the default)."""
    argv = list(container.get("command", [])) + list(container.get("args", []))
    for i, word in enumerate(argv):
        if word.startswith("--signal-exit-code="):
            return word.split("=", 1)[1]
        if word == "--signal-exit-code" and i + 1 < len(argv):
            return argv[i + 1]
    for var in container.get("env", []):
        if var.get("name") == "PET_SIGNAL_EXIT_CODE" and "value" in var:
            return var["value"]
    return "torchrun"


DOCUMENTED = {"torchrun": 1, "shell": 128 + signal.SIGTERM}
_measured = {}


def sigterm_exit_code(mode):
    """ddprun's exit code when SIGTERM stops it in `mode`: measured on the
    built ddprun (a worker running, as in a pod), else the documented one."""
    binary = c.binaries.get("ddprun")
    if not binary:
        return DOCUMENTED[mode]
    if mode in _measured:
        return _measured[mode]
    binary = os.path.abspath(binary)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "TORCHELASTIC_", "DDPRUN_"))}
    with tempfile.TemporaryDirectory() as work:
        ready = os.path.join(work, "ready")
        agent = subprocess.Popen(
            [binary, "--standalone", "--nproc-per-node", "1",
             "--signal-exit-code", mode, "--no-python",
             "sh", "-c", 'touch "$0" && exec sleep 120', ready],
            cwd=work, env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: os.path.exists(ready) or agent.poll() is not None,
                     60)
            started = os.path.exists(ready)
            agent.send_signal(signal.SIGTERM)
            code = agent.wait(timeout=60)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    c.check(started, f"ddprun --signal-exit-code {mode}: no worker within 60 s")
    c.check(code == DOCUMENTED[mode],
            f"ddprun --signal-exit-code {mode} exited {code} on SIGTERM, "
            f"documented {DOCUMENTED[mode]}")
    _measured[mode] = code
    return code


def check_job(spec, where):
    """spec: a Job's spec (podFailurePolicy, template) whose one container
    runs ddprun."""
    rules = spec.get("podFailurePolicy", {}).get("rules", [])
    c.check(bool(rules), f"{where}: no podFailurePolicy")
    (container,) = spec["template"]["spec"]["containers"]
    name = container["name"]
    mode = signal_exit_mode(container)
    stopped = sigterm_exit_code(mode)
    cases = [
        (f"node drained: SIGTERM, ddprun exits {stopped} ({mode})",
         failed_pod(name, stopped, "EvictionByEvictionAPI"), "Ignore"),
        (f"pod preempted: ddprun exits {stopped}",
         failed_pod(name, stopped, "PreemptionByScheduler"), "Ignore"),
        ("node drained, ddprun killed after the grace period (137)",
         failed_pod(name, 137, "EvictionByEvictionAPI"), "Ignore"),
        ("no rendezvous within read_timeout: exit 75 (EX_TEMPFAIL), retried",
         failed_pod(name, 75), "Count"),
        ("ddprun's restarts spent: exit 1", failed_pod(name, 1), "FailJob"),
        (f"ddprun stopped with no disruption ({stopped})",
         failed_pod(name, stopped), "FailJob"),
    ]
    for what, pod, expected in cases:
        got = policy_action(rules, pod)
        c.check(got == expected, f"{where}: {what}: the policy says {got}, expected "
                f"{expected} (rules in order: {[r['action'] for r in rules]})")
    return rules, cases


def job_specs(node, where):
    """Every Job spec under a manifest: a Job's own, a JobSet's or a
    TrainingRuntime's replicated jobs' templates."""
    if isinstance(node, dict):
        if "podFailurePolicy" in node and "template" in node:
            yield node, where
            return
        for key, value in node.items():
            yield from job_specs(value, where)
    elif isinstance(node, list):
        for value in node:
            yield from job_specs(value, where)


objects = {}
for path in sorted(glob.glob(c.path("deploy", "k8s", "base", "*.yaml"))):
    for doc in c.load_yaml(path):
        objects[(doc.get("kind"), doc.get("metadata", {}).get("name"))] = doc
(job,) = [d for (kind, _), d in objects.items() if kind == "Job"]
rules, cases = check_job(job["spec"], "k8s base Job")

# The evaluator takes the order into account: with the exit-code rule first
# (the order before this test) a drained node fails the Job.
drained = cases[0][1]
ignore = [r for r in rules if r["action"] == "Ignore"]
fail = [r for r in rules if r["action"] == "FailJob"]
c.check(policy_action(fail + ignore, drained) == "FailJob" and
        policy_action(ignore + fail, drained) == "Ignore",
        "the evaluator ignores the rules' order")

examples = 0
for name in ("jobset.yaml", "trainjob.yaml"):
    for doc in c.load_yaml("deploy", "k8s", "examples", name):
        for spec, where in job_specs(doc, f"examples/{name} {doc.get('kind')}"):
            check_job(spec, where)
            examples += 1
c.check(examples >= 2, f"found {examples} Job templates in the JobSet and "
        "Trainer examples, expected one each")

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
        check_job(built["spec"], f"{os.path.basename(overlay)} overlay Job")
c.finish()
