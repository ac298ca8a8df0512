#!/usr/bin/env python3
"""Function-length and file-length figures of the C++ sources.

    scripts/code-figures.py [ROOT] [--list N]

Counts lines per file (all lines) and per function body (from the line of
its opening brace to the line of its closing one) over the .cc and .h files
under common/ launcher/ rendezvous/ relay/ worker/ mnist/ (production) and
tests/ (tests), and prints count, median, 90th percentile, max and how many
exceed a threshold, for each. A function is a brace block whose head (the
text since the previous ';', '{' or '}') has a parameter list and is not a
control statement, class, namespace, initializer or lambda; lambdas count
inside the function that holds them. Text, not a parser: good for before
and after figures of the same tree, not for an exact census.
"""
import argparse
import os
import re
import statistics

PRODUCTION = ["common", "launcher", "rendezvous", "relay", "worker", "mnist"]
TESTS = ["tests"]
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|return)\b")
NOT_FUNCTION = re.compile(
    r"\b(namespace|class|struct|enum|union)\b|=\s*$|\]\s*(\(.*\))?\s*"
    r"(mutable\s*)?(->\s*[\w:<>]+\s*)?$")


def strip(text):
    """Blanks comments, string and character literals, keeping newlines."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = ")" + (m.group(1) if m else "") + '"'
            j = text.find(end, i)
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """Yields the line count of each outermost function body."""
    text = strip(text)
    text = re.sub(r"^\s*#.*$", "", text, flags=re.M)  # preprocessor lines
    stack = []  # (is_function, start_line)
    head_start = 0
    line = 1
    in_function = 0
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            head = text[head_start:i].strip()
            is_fn = (in_function == 0 and ")" in head and "(" in head and
                     not CONTROL.search(head) and not NOT_FUNCTION.search(head))
            stack.append((is_fn, line))
            if is_fn:
                in_function += 1
            head_start = i + 1
        elif c == "}":
            if stack:
                is_fn, start = stack.pop()
                if is_fn:
                    in_function -= 1
                    yield line - start + 1, start
            head_start = i + 1
        elif c == ";":
            head_start = i + 1


def sources(root, folders):
    for folder in folders:
        for base, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = sorted(d for d in dirs if d != "build")
            for name in sorted(files):
                if name.endswith((".cc", ".h")):
                    yield os.path.join(base, name)


def summary(label, values, thresholds):
    values = sorted(values)
    if not values:
        return f"{label}: none"
    p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
    over = ", ".join(f">{t}: {sum(v > t for v in values)}" for t in thresholds)
    return (f"{label}: {len(values)}, median {statistics.median(values):g}, "
            f"p90 {p90}, max {values[-1]}, {over}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root", nargs="?", default=".")
    parser.add_argument("--list", type=int, default=0,
                        help="also list the N longest files and functions")
    args = parser.parse_args()
    for name, folders in (("production", PRODUCTION), ("tests", TESTS)):
        file_lines, fn_lines, longest, longest_fn = [], [], [], []
        for path in sources(args.root, folders):
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            n = text.count("\n")
            file_lines.append(n)
            longest.append((n, os.path.relpath(path, args.root)))
            for n_fn, start in functions(text):
                fn_lines.append(n_fn)
                longest_fn.append((n_fn, f"{os.path.relpath(path, args.root)}:{start}"))
        print(summary(f"{name} files (lines)", file_lines, (500, 1000)))
        print(summary(f"{name} functions (lines)", fn_lines, (50, 100)))
        for what, rows in (("file", longest), ("function", longest_fn)):
            for n, where in sorted(rows, reverse=True)[:args.list]:
                print(f"  {what} {n:5d} {where}")


if __name__ == "__main__":
    main()
