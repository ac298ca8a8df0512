"""Every program's command line: --version (the project's version) and
--help exit 0; a bad flag, a bad value and a mistyped --log-level exit 2
with one line naming the problem.

Usage: cli_exit_test.py PROGRAM...
"""
import re
import subprocess
import sys


def run(argv):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=60)


def main():
    failures = []
    for program in sys.argv[1:]:
        name = program.rsplit("/", 1)[-1]
        p = run([program, "--version"])
        if p.returncode != 0 or not re.fullmatch(
                re.escape(name) + r" \d+\.\d+\.\d+\n", p.stdout):
            failures.append("%s --version: rc %d, %r" % (name, p.returncode, p.stdout))
        p = run([program, "--help"])
        if p.returncode != 0 or "--log-level" not in p.stdout:
            failures.append("%s --help: rc %d" % (name, p.returncode))
        for bad, needle in ((["--no-such-flag"], "--no-such-flag"),
                            (["--log-level", "verbose"], "verbose")):
            p = run([program] + bad + ["x"])
            lines = p.stderr.strip().splitlines()
            if p.returncode != 2 or len(lines) != 1 or needle not in lines[0]:
                failures.append("%s %s: rc %d, stderr %r" %
                                (name, " ".join(bad), p.returncode, p.stderr))
    if failures:
        sys.exit("\n".join(failures))
    print("OK: %d programs" % (len(sys.argv) - 1))


if __name__ == "__main__":
    main()
