// ddprun-rendezvous's main() as it is, under the name DdprunRendezvousMain, for
// the multi-call executable (multi_call_main.cc): one source of truth for the
// program, however it is shipped.
#define main DdprunRendezvousMain
#include "rendezvous/main.cc"
