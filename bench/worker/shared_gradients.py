"""ddprun-mnist with shared gradients (the default: gradients allocated in
the node's shared memory and summed there) against --gradient-sync process-group
(each gradient copied into the shared segment for the allreduce), the
same build, interleaved (on, off, off, on, ...), at each --hidden width and
world size. Medians of samples/s and of the sync's time per step, and the
ratio on/off per pair of neighbouring runs (the VM's slow minutes cancel in
them). Both must train to the same final loss and parameters, bit for bit
(final_loss_hex and parameters_fnv1a64): the script fails if they do not.

  /usr/bin/python3 bench/worker/shared_gradients.py [--runs 5]
      [--hidden 128,8192] [--worlds 2] [--max-steps 300]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from compare import ROOT, built_programs


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hidden", default="128,8192")
    parser.add_argument("--worlds", default="2")
    parser.add_argument("--max-steps", type=int, default=300,
                        help="steps per run (0: one whole epoch)")
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "data", "mnist"))
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    ddprun, mnist = built_programs()
    out = tempfile.mkdtemp(prefix="bench-shared-")
    load = os.getloadavg()
    print(f"{os.cpu_count()} cores, load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; "
          f"{args.runs} runs per setting, interleaved")
    print("| hidden | world | samples/s shared | samples/s copied | ratio (median of pairs) "
          "| sync ms/step shared | copied | allreduces in place / fallbacks |")
    print("|---|---|---|---|---|---|---|---|")
    for hidden in (int(h) for h in args.hidden.split(",")):
        for world in (int(w) for w in args.worlds.split(",")):
            results = {"on": [], "off": []}
            for i in range(args.runs):
                order = ["on", "off"] if i % 2 == 0 else ["off", "on"]
                for mode in order:
                    summary = os.path.join(out, f"{hidden}-{world}-{mode}-{i}.json")
                    command = [ddprun, "--standalone", "--nproc-per-node", str(world), mnist,
                               "--data-dir", args.data_dir, "--epochs", "1",
                               "--hidden", str(hidden), "--save", "", "--no-progress",
                               "--summary-json", summary,
                               "--gradient-sync", "auto" if mode == "on" else "process-group"]
                    if args.max_steps:
                        command += ["--max-steps", str(args.max_steps)]
                    done = subprocess.run(command, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True,
                                          timeout=args.timeout)
                    if done.returncode != 0:
                        sys.exit(f"failed: {' '.join(command)}\n{done.stdout[-3000:]}")
                    with open(summary) as f:
                        results[mode].append(json.load(f))
            # The exact bits: the loss as a hex float, the parameters as a
            # digest of their raw bytes (final_loss itself is rounded).
            bits = {(r["final_loss_hex"], r["parameters_fnv1a64"])
                    for r in results["on"] + results["off"]}
            if len(bits) != 1:
                sys.exit(f"hidden {hidden} world {world}: final models differ "
                         f"(loss bits, parameter digest): {bits}")
            on, off = results["on"], results["off"]
            ratios = [a["samples_per_sec"] / b["samples_per_sec"] for a, b in zip(on, off)]

            def med(rs, key):
                return statistics.median(r[key] for r in rs)
            print(f"| {hidden} | {world} | {med(on, 'samples_per_sec'):.0f} "
                  f"| {med(off, 'samples_per_sec'):.0f} | {statistics.median(ratios):.2f}x "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) "
                  f"| {1e3 * med(on, 'allreduce_seconds_per_step'):.3f} "
                  f"| {1e3 * med(off, 'allreduce_seconds_per_step'):.3f} "
                  f"| {med(on, 'allreduces_in_place'):.0f} / "
                  f"{med(on, 'allreduces_in_place_fallbacks'):.0f} |")
    print(f"summaries: {out}")


if __name__ == "__main__":
    main()
