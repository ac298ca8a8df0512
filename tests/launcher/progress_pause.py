# A worker that steps, then pauses 3 s without a word, then ends well.
# With argv[1] == "report" it reports each step with ddprun's module
# (python/ddprun/progress.py), so the agent finds the pause a hang once it
# outlasts the step phase's bound; with "quiet" it reports nothing, and the
# agent waits for it as torchrun would.
import sys
import time

report = sys.argv[1] == "report"
if report:
    import ddprun.progress as progress
for _ in range(20):
    time.sleep(0.01)
    if report:
        progress.step()
time.sleep(3)
