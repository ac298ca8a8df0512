# Writes this worker's environment to OUT_DIR/env_<RANK>.json: the torchrun
# environment diff compares them. No torch import: the launcher alone sets it.
import json
import os
import sys

with open(os.path.join(sys.argv[1], "env_%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(dict(os.environ), f, indent=1, sort_keys=True)
