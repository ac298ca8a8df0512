"""docs/TORCHRUN.md's tables, run: each row's *Try* cell is a ddprun command
line (leading NAME=VALUE words are its environment). A row marked
**refused** must exit 2 with the quoted message, any other must exit 0; a
flag row is run a second time with the flag as torchrun's PET_<FLAG>
variable instead. The table cannot drift from what ddprun does.

Usage: torchrun_table_test.py --ddprun PATH --doc docs/TORCHRUN.md
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROW = re.compile(r"^\| (?P<name>[^|]+) \| `(?P<try>[^`]+)` \| "
                 r"\*\*(?P<verdict>[a-z]+)\*\*(?P<rest>.*)\|$")
SHORT = {"-m": "--module", "-r": "--redirects", "-t": "--tee"}


def split_env(words):
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def pet_form(words):
    """The row's first flag moved into PET_<FLAG>; None when not a flag."""
    if not words or not words[0].startswith("-"):
        return None
    flag = SHORT.get(words[0], words[0])
    takes_value = len(words) > 1 and not words[1].startswith("-")
    switches = {"--standalone", "--no-python", "--run-path",
                "--virtual-local-rank", "--module"}
    name = "PET_" + flag.lstrip("-").replace("-", "_").upper()
    if flag in switches or not takes_value:
        return {name: "1"}, words[1:]
    return {name: words[1]}, words[2:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddprun", required=True)
    parser.add_argument("--doc", required=True)
    args = parser.parse_args()
    args.ddprun = os.path.abspath(args.ddprun)
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("PET_", "TORCHELASTIC_", "TORCH_ELASTIC_",
                                     "DDPRUN_TOKEN"))}
    base_env.setdefault("PYTHON_EXEC", "/usr/bin/python3")
    rows = []
    for line in open(args.doc):
        m = ROW.match(line.strip())
        if m:
            rows.append(m)
    failures = []
    tried = 0
    for m in rows:
        env, words = split_env(shlex.split(m["try"]))
        forms = [(env, words)]
        pet = pet_form(words)
        if pet is not None and m["name"].strip().startswith("`-"):
            forms.append(({**env, **pet[0]}, pet[1]))
        want = re.search(r'"([^"]+)"', m["rest"])
        for extra, argv in forms:
            with tempfile.TemporaryDirectory() as work:
                # TMPDIR: a row with --redirects or --tee keeps its logs
                # in a temporary folder; the test's own, not /tmp.
                p = subprocess.run([args.ddprun] + argv, cwd=work,
                                   env={**base_env, "TMPDIR": work, **extra},
                                   stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True,
                                   timeout=60)
            tried += 1
            shown = " ".join(["%s=%s" % kv for kv in extra.items()] + argv)
            if m["verdict"] == "refused":
                if want is None:
                    failures.append("%s: a refused row quotes no message" %
                                    shown)
                elif p.returncode != 2 or want[1] not in p.stdout:
                    failures.append("%s: rc %d, want 2 and %r: %r" %
                                    (shown, p.returncode, want[1], p.stdout))
            elif p.returncode != 0:
                failures.append("%s: rc %d, want 0: %r" %
                                (shown, p.returncode, p.stdout))
            elif (m["verdict"] == "ignored" and
                  m["name"].strip().startswith("`-") and
                  "ignored" not in p.stdout):
                failures.append("%s: an ignored flag must say so once: %r" %
                                (shown, p.stdout))
    if len(rows) < 40:
        failures.append("only %d rows found in %s" % (len(rows), args.doc))
    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("OK: %d rows, %d command lines as the table says" %
          (len(rows), tried))


if __name__ == "__main__":
    main()
