#!/bin/bash
# ddprun-rendezvous: the wheel's one executable, bin/ddprun, run under this name.
exec -a "$0" "$(dirname -- "$(readlink -f -- "$0")")/ddprun" "$@"
