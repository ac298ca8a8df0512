"""ddprun's Python side: what a worker started by ddprun may import.

``ddprun.progress`` reports a worker's phases and steps to its agent, which
then finds a hang in any phase (docs/ARCHITECTURE.md, "Hangs").
"""
