#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ddprun::worker {

struct ShmAllreduceOptions {
  // A folder in shared memory (the node's DDPRUN_SHM_DIR) and the segment's
  // file name there, the same on every local rank of the group.
  std::string dir;
  std::string name;
  int local_rank = 0;
  int local_size = 1;
  // How long one rank waits for another's next step before it fails.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  // Buffers are reduced in slices of this many floats; the segment holds
  // 4 x (local_size + 1) of them. 128 KiB slices: a slice's copy-in and its
  // sum stay in the core's L2 cache, and the ranks work on neighbouring
  // slices at once (at 64 MB, 2 ranks: 1 MiB slices took ~1.5x as long).
  int64_t slice_floats = 32 * 1024;
  // At 2 local ranks (not hierarchical), a call of up to this many floats
  // goes through as one slice: one wait per call instead of one per slice
  // (slices do not overlap anything at 2 ranks, where both do the same
  // work at once). 128 K floats (512 KiB) covers a small model's whole
  // gradient (the MNIST MLP: 101,770 floats) while its input and the
  // segment's copy still fit in L2; the segment's buffers are sized for it.
  int64_t whole_call_floats = 128 * 1024;
  // At 2 local ranks, calls of several slices copy each slice in one slice
  // ahead of its sum (Allreduce). Off only to measure against.
  bool pipeline = true;
};

// Sum of a float buffer over the ranks of one node, through one shared
// segment, no sockets. Buffers go through in slices; per slice, one of two
// schedules, chosen from the local size and the slice's length (the same on
// every rank):
// - each sums all (2 local ranks, or short slices): every rank copies its
//   slice in, waits once for the others', and sums every input, its own
//   read from its own buffer, in local-rank order;
// - reduce-scatter, then all-gather (more ranks, long slices; always when
//   hierarchical): every rank copies in the parts the others reduce, local
//   rank r reduces the r-th chunk over all inputs in local-rank order, then
//   every rank copies the whole reduced slice out.
// Either way every rank gets the same bits. Slices alternate between two
// buffer sets, so one slice's reading overlaps the next one's copy-in.
// Ranks signal one another with counters in the segment and a shared futex;
// waiters spin briefly (without yielding the core), then sleep.
//
// Hierarchical use: with `between_nodes`, local rank 0 hands each reduced
// slice to it (e.g. a Gloo allreduce among node leaders) before the others
// copy it out.
//
// Failure: a local rank that dies while another waits for it (its lock on
// the segment is released by the kernel; a rank that finished its calls
// and closed the segment looks the same, and is not waited for), or fails
// and says so in the segment, or makes no progress for `timeout` (stopped
// or hung), ends the wait of every other rank with an error that names it.
// After an error the object only returns that error.
//
// Lifetime: local rank 0 creates the file (space reserved up front, so a
// full tmpfs is an error here, not a SIGBUS later); the last rank to map it
// unlinks it, so the memory goes when the last rank goes. A file left by a
// rank that died before every rank mapped it goes with the agent's folder.
//
// Every local rank must make the same sequence of calls with the same
// counts. Not thread-safe: one thread per process calls Allreduce.
class ShmAllreduce {
 public:
  // Local rank 0: creates and publishes the segment. The others call Attach
  // once it is published (the caller orders this, e.g. through its store).
  static absl::StatusOr<std::unique_ptr<ShmAllreduce>> Create(
      const ShmAllreduceOptions& options);
  static absl::StatusOr<std::unique_ptr<ShmAllreduce>> Attach(
      const ShmAllreduceOptions& options);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  using BetweenNodes = std::function<absl::Status(float* data, int64_t count)>;
  // Sums `data` over the local ranks (and, with `between_nodes`, over the
  // nodes), in place.
  absl::Status Allreduce(float* data, int64_t count,
                         const BetweenNodes& between_nodes = nullptr);

  // One buffer made of several (e.g. a model's gradients, in place: no
  // flattening copy before, none after). Every rank passes parts of the
  // same total length (their boundaries may differ). Each element becomes
  // sum / divisor (one IEEE division of the sum, so the bits are those of
  // summing, then dividing).
  struct Part {
    float* data;
    int64_t count;
  };
  absl::Status Allreduce(absl::Span<const Part> parts, float divisor,
                         const BetweenNodes& between_nodes = nullptr);

  // Resident buffers (PyTorch DDP's gradient_as_bucket_view, in shared
  // memory): a buffer of `floats` of this rank's own in the node's shared
  // memory (DDPRUN_SHM_DIR), mapped by every local rank, so that an
  // allreduce of it reads the others' buffers where they lie: nothing is
  // copied in before the sum, nothing out after it (DataParallel's
  // gradients can live there, autograd writing them in place). Collective
  // over the local ranks (the same `floats` on each), at most once per
  // object; the files' names go once every rank mapped them. When a rank
  // cannot reserve its buffer (a full tmpfs), every rank returns an error
  // and the object stays usable for the other calls.
  absl::StatusOr<float*> MapResident(int64_t floats);
  // Allreduce(parts, divisor) for parts that may lie in the ranks' resident
  // buffers (MapResident), e.g. gradients a GradientArena allocated there:
  // when every rank's parts all do, with the same counts, they are summed
  // where they lie (local rank r sums chunk r of every rank's parts and
  // writes it into the others': reduce-scatter, all-gather by push, two
  // waits per call, no copy in or out). Otherwise (a part elsewhere on some
  // rank, counts that differ, more than kMaxTableParts parts) every rank goes
  // through Allreduce's copies, one wait later. The ranks agree through a
  // table of each one's part offsets in the segment. Inside one node only;
  // `parts` must not overlap.
  static constexpr int kMaxTableParts = 1024;
  absl::Status AllreduceInPlace(absl::Span<const Part> parts, float divisor);
  // Keeps this rank's resident buffer mapped as long as the returned
  // pointer lives, past this object (tensors allocated in it may outlive
  // the group). Null before MapResident.
  std::shared_ptr<void> resident_keep_alive() const { return own_resident_; }

  // Tells the other local ranks that this one failed (they stop waiting and
  // report `message`); for failures outside Allreduce.
  void Abort(const std::string& message);

  const std::string& path() const { return path_; }

  // Slices summed by each schedule so far: tests check which one ran.
  struct Stats {
    int64_t each_sums_all_slices = 0;
    int64_t scattered_slices = 0;
    // Calls that went through as one slice (whole_call_floats).
    int64_t whole_calls = 0;
    // Each-sums-all slices summed one slice behind their copy-in
    // (ShmAllreduceOptions::pipeline); also counted in each_sums_all_slices.
    int64_t pipelined_slices = 0;
    // AllreduceInPlace calls summed where the parts lie, and those that
    // fell back to copies (some rank's parts were not all resident).
    int64_t in_place_calls = 0;
    int64_t in_place_fallbacks = 0;
    // Waits for a peer that were not over at once, by how they ended:
    // while spinning (a few pause loops), while spinning longer (up to
    // kSpinTime, checking the clock), or after sleeping on the futex at least
    // once. A sleep costs tens of microseconds on a VM (waking a halted
    // vCPU): the benchmarks print these per call to find a slow tail.
    int64_t waits_spun = 0;
    int64_t waits_spun_long = 0;
    int64_t waits_slept = 0;
  };
  const Stats& stats() const { return stats_; }

  // The segment's layout (shm_allreduce.cc).
  struct Header;
  struct Counter;
  struct PartTable;

 private:
  ShmAllreduce(const ShmAllreduceOptions& options, std::string path, int fd,
               void* base, size_t size);
  // Whether a call of `count` floats goes through as one slice.
  bool WholeCall(int64_t count, bool between_nodes) const;
  absl::Status Join();
  // Every wait of this class: until `laggard()` returns -1; else it names a
  // local rank not there yet (for the error message), `phase` says what it
  // was waited for. Fails on a peer's failure, death or the timeout.
  // (A FunctionRef: no allocation per wait.)
  absl::Status WaitFor(absl::FunctionRef<int()> laggard, const char* phase);
  // The first local rank whose counter is below target, or -1.
  int FirstBelow(const Counter* counters, uint64_t target) const;
  bool EachSumsAll(int64_t n, bool between_nodes) const;
  // Where the current slice lies in the caller's parts.
  class Pieces;
  absl::Status SliceEachSumsAll(const Pieces& mine, int64_t n, uint64_t seq,
                                float divisor);
  // SliceEachSumsAll's two halves: the copy in (and its signal), then the
  // wait for the others' inputs and the sum.
  void CopyIn(const Pieces& mine, int64_t n, uint64_t seq);
  absl::Status SumAll(const Pieces& mine, int64_t n, uint64_t seq,
                      float divisor);
  absl::Status SliceScattered(const Pieces& mine, int64_t n, uint64_t seq,
                              float divisor, const BetweenNodes& between_nodes);
  void Signal();
  absl::Status Fail(absl::Status status);
  bool PeerAlive(int local_rank) const;
  float* Input(int buffer, int local_rank) const;
  float* Output(int buffer) const;
  PartTable* Table(int local_rank) const;
  // AllreduceInPlace's sum, once every rank's table says its parts lie in
  // its resident buffer with the same counts as this rank's.
  absl::Status SumInPlace(absl::Span<const Part> parts, int64_t count,
                          uint64_t seq, float divisor);

  ShmAllreduceOptions options_;
  std::string path_;
  int fd_ = -1;
  void* base_ = nullptr;
  size_t size_ = 0;
  Header* header_ = nullptr;
  int64_t buffer_floats_ = 0;  // one input or output buffer's capacity
  // Every local rank's resident buffer (this one's writable), or empty.
  std::vector<float*> residents_;
  int64_t resident_floats_ = 0;
  std::shared_ptr<void> own_resident_;  // unmaps residents_[local_rank]
  uint64_t seq_ = 0;     // slices done, the same on every local rank
  absl::Status failed_;  // sticky
  Stats stats_;
};

}  // namespace ddprun::worker
