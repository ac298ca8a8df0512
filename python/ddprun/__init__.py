"""ddprun's Python side: helpers for programs that ddprun launches."""
