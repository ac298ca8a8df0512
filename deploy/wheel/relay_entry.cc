// ddprun-relay's main() as it is, under the name DdprunRelayMain, for the
// multi-call executable (multi_call_main.cc): one source of truth for the
// program, however it is shipped.
#define main DdprunRelayMain
#include "relay/main.cc"
