#pragma once

// The messages between the agent's StandbyPool (launcher/agent/
// standby_pool.*) and a zygote, libddp's AwaitActivation serving on
// DDPRUN_ZYGOTE_FD (worker/standby.*): one Unix SOCK_SEQPACKET socket, one
// message per datagram, text so that either side's log can quote it.
//
// zygote -> agent, once it waits in AwaitActivation:
//   "ready PID"                   it serves forks; or
//   "refused REASON"              it cannot (it runs threads): it exits.
// agent -> zygote, one per standby wanted, with SCM_RIGHTS descriptors:
//   "fork"                        the standby's DDPRUN_STANDBY_FD read end,
//                                 then its progress write end and control
//                                 read end when the payload says so:
//   "fork progress control"       (either word may be missing)
// zygote -> agent, in the order of the requests:
//   "forked PID STANDBY_FD PROGRESS_FD CONTROL_FD"   the descriptors'
//                                 numbers in the standby (-1: none); or
//   "failed REASON"               this one could not be made (the zygote
//                                 goes on serving).
// End of file on either side ends the zygote.
//
// A zygote that a worker forks (DDPRUN_ZYGOTE_SEED_FD: the seed) speaks the
// same, from "ready" on; the worker may answer "refused REASON" instead.
// Before the worker starts, the agent puts one message on the socket:
//   "stdio"                       with its standard output and error
//                                 (SCM_RIGHTS), which become the zygote's.
namespace ddprun::common::zygote {

inline constexpr char kReady[] = "ready";
inline constexpr char kRefused[] = "refused";
inline constexpr char kFork[] = "fork";
inline constexpr char kWithProgress[] = "progress";
inline constexpr char kWithControl[] = "control";
inline constexpr char kForked[] = "forked";
inline constexpr char kFailed[] = "failed";
inline constexpr char kStdio[] = "stdio";
// The largest message either side sends.
inline constexpr int kMaxMessage = 4096;

}  // namespace ddprun::common::zygote
