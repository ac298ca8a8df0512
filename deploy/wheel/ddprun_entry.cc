// ddprun's main() as it is, under the name DdprunMain, for the
// multi-call executable (multi_call_main.cc): one source of truth for the
// program, however it is shipped.
#define main DdprunMain
#include "launcher/cli/main.cc"
