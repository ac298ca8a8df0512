"""Shared checks for the deployment-file tests (no container engine, no
cluster here): commands in manifests must name ddprun's real programs, and
when the programs are built, every flag they pass must be in that program's
--help. Run with /usr/bin/python3 (python3-yaml)."""

import argparse
import os
import re
import subprocess
import sys

import yaml

PROGRAMS = ("ddprun", "ddprun-rendezvous", "ddprun-mnist")
# ddprun flags that take no value (the rest take one).
DDPRUN_BOOL_FLAGS = {"--standalone", "--no-python", "--no_python", "-m",
                     "--module", "--help", "-h"}


class Checker:
    """Collects failures so that one run reports all of them."""

    def __init__(self, name):
        self.name = name
        self.failures = []
        self.checks = 0
        parser = argparse.ArgumentParser()
        parser.add_argument("--source-dir", required=True)
        for program in PROGRAMS:
            parser.add_argument("--" + program)
        args = parser.parse_args()
        self.source_dir = args.source_dir
        self.binaries = {p: getattr(args, p.replace("-", "_")) for p in PROGRAMS}
        self._help = {}

    def check(self, condition, message):
        self.checks += 1
        if not condition:
            self.failures.append(message)
        return condition

    def path(self, *parts):
        return os.path.join(self.source_dir, *parts)

    def load_yaml(self, *parts):
        with open(self.path(*parts)) as f:
            return [d for d in yaml.safe_load_all(f) if d is not None]

    def help(self, program):
        """The program's --help text, or None when it is not built here."""
        binary = self.binaries.get(program)
        if not binary:
            return None
        if program not in self._help:
            run = subprocess.run([binary, "--help"], capture_output=True,
                                 text=True, timeout=60)
            self._help[program] = run.stdout + run.stderr
            self.check(run.returncode == 0,
                       f"{binary} --help exited {run.returncode}")
        return self._help[program]

    def check_flag(self, program, flag, where):
        text = self.help(program)
        if text is None:
            return
        name = flag.split("=", 1)[0]
        self.check(re.search(re.escape(name) + r"\b", text) is not None,
                   f"{where}: {program} has no flag {name} (not in its --help)")

    def check_command(self, argv, where):
        """argv as a manifest runs it: a program, its flags, and for ddprun
        the training program after the first positional argument."""
        if not self.check(bool(argv), f"{where}: empty command"):
            return
        program = os.path.basename(argv[0])
        if not self.check(program in PROGRAMS,
                          f"{where}: runs '{argv[0]}', not one of {PROGRAMS}"):
            return
        rest = list(argv[1:])
        if program == "ddprun" and rest[:1] == ["status"]:
            rest = rest[1:]
        i = 0
        while i < len(rest):
            token = rest[i]
            if token.startswith("-"):
                self.check_flag(program, token, where)
                if (program == "ddprun" and "=" not in token
                        and token not in DDPRUN_BOOL_FLAGS):
                    i += 1  # its value
            elif program == "ddprun":
                # The training program and its own arguments.
                self.check_command(rest[i:], where + " (training program)")
                return
            i += 1

    def check_pet_env(self, env, where):
        """PET_<FLAG> variables must name real ddprun flags."""
        for name in env:
            if name.startswith("PET_"):
                flag = "--" + name[4:].lower().replace("_", "-")
                self.check_flag("ddprun", flag, f"{where}: {name}")

    def skip(self, reason):
        """Exits 77 (ctest: skipped), or 1 under CI=true, where nothing may
        skip: CI must have what every test needs."""
        if os.environ.get("CI") == "true":
            print(f"FAIL: {self.name}: {reason} (CI=true: a skip is a failure)",
                  file=sys.stderr)
            sys.exit(1)
        print(f"SKIP: {self.name}: {reason}", file=sys.stderr)
        sys.exit(77)

    def finish(self):
        for failure in self.failures:
            print("FAIL:", failure, file=sys.stderr)
        built = [p for p, b in self.binaries.items() if b]
        print(f"{self.name}: {self.checks} checks, {len(self.failures)} failed; "
              f"flags checked against --help of: {', '.join(built) or 'none (not built)'}")
        sys.exit(1 if self.failures else 0)


def scrape_in(netns, url):
    """The /metrics text at `url` as a scraper inside network namespace
    `netns` sees it; empty when it cannot be fetched."""
    run = subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", "/usr/bin/python3", "-c",
         "import sys, urllib.request; "
         "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())",
         url], capture_output=True, text=True, timeout=30)
    return run.stdout if run.returncode == 0 else ""
