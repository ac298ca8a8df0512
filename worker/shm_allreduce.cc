#include "worker/shm_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <new>
#include <optional>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"
#include "worker/collective_abort.h"

// Written here rather than taken from a library: the collective libraries
// with a shared-memory path (oneCCL, DeepSpeed's CPU allreduce, NCCL's SHM
// transport) are not packaged for Debian (or need a GPU), and Gloo, which
// is, has none. The whole mechanism is ~300 lines of memcpy, additions and
// counters.
namespace ddprun::worker {
namespace {

constexpr uint64_t kMagic = 0x646470727573686dULL;  // "ddprushm"
constexpr int kVersion = 6;
constexpr int kMaxLocal = 64;
constexpr int64_t kAlignFloats = 16;  // 64 bytes: chunks never share a line
// How a waiter waits: busy checks (a peer on another core answers within
// microseconds) up to kSpinTime, then sleeps on the shared futex. Sleeping
// early is what costs most on a VM: waking a halted vCPU takes tens of
// microseconds, longer than most waits. The spin does not sched_yield: a
// yield hands the core to any runnable task, SCHED_IDLE ones included (the
// agent's zygote and standbys starting beside the training), and under
// EEVDF (Linux 6.6+) each yield also pushes the waiter's deadline back by a
// slice, so a waiter that yields in a loop can lose its core for
// milliseconds after its peer arrived. Measured (bench/worker/README.md,
// wave 17): a SCHED_IDLE busy loop beside a world-2 ddprun-mnist took 25-36 %
// of its samples/s with yields, 9-14 % without; a futex sleep does not have
// that cost, since a waking rank preempts a SCHED_IDLE task at once.
constexpr int kPauseSpins = 64;
// Buffer sets the slices rotate through: a rank may run this many slices
// ahead of the slowest, so that short stalls of one rank do not stop the
// others at once.
constexpr int kBuffers = 4;
constexpr auto kSpinTime = std::chrono::microseconds(200);
// A sleeping waiter wakes at least this often to look for dead peers.
constexpr auto kLivenessPeriod = std::chrono::milliseconds(10);
// MapResident's steps per local rank, in Header::resident: its buffer
// exists (or it could not make one), then it mapped every other rank's.
constexpr uint64_t kResidentCreated = 1;
constexpr uint64_t kResidentMapped = 2;
constexpr uint64_t kResidentRefused = 3;
// Up to this many local ranks (and for any count of at most
// kEachSumsAllMaxFloats per slice), every rank sums every input itself: one
// wait per slice instead of two, for the same bytes moved at 2 ranks.
constexpr int kEachSumsAllMaxRanks = 2;
constexpr int64_t kEachSumsAllMaxFloats = 16 * 1024;

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// A hint to the core that this thread spins (lets a sibling hyperthread run).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

absl::Status Errno(const std::string& what, const std::string& path,
                   int error) {
  return absl::UnavailableError(
      absl::StrFormat("shared-memory allreduce: cannot %s %s: %s", what, path,
                      std::strerror(error)));
}

// The state of process `pid` as /proc shows it ('R', 'S', 'T' stopped, ...).
char ProcessState(int pid) {
  std::ifstream stat(absl::StrFormat("/proc/%d/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)),
                   std::istreambuf_iterator<char>());
  size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return '?';
  return text[close + 2];
}

// Eight floats, loaded and stored unaligned; the compiler lowers it to one
// AVX register or two SSE ones, whichever the clone below targets.
typedef float Floats8 __attribute__((vector_size(32), aligned(4), may_alias));

#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DDPRUN_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef DDPRUN_VECTOR_CLONES
#define DDPRUN_VECTOR_CLONES
#endif

// What SumInto does to each sum: nothing, multiply by the exact reciprocal
// of a power of two, or divide.
enum class Scale { kNone, kMultiply, kDivide };

// SumInto's vector part for one Scale and (kInputs > 0) a fixed number of
// inputs, so that the loop carries no per-block decision; returns how far
// it got (a multiple of 32 floats).
template <Scale kScale, int kInputs>
__attribute__((always_inline)) inline int64_t SumBlocks(float* out,
                                                        const float* const* in,
                                                        int inputs, int64_t n,
                                                        float factor) {
  if (kInputs > 0) inputs = kInputs;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    Floats8 s0 = *reinterpret_cast<const Floats8*>(in[0] + i);
    Floats8 s1 = *reinterpret_cast<const Floats8*>(in[0] + i + 8);
    Floats8 s2 = *reinterpret_cast<const Floats8*>(in[0] + i + 16);
    Floats8 s3 = *reinterpret_cast<const Floats8*>(in[0] + i + 24);
    for (int k = 1; k < inputs; ++k) {
      const float* x = in[k] + i;
      s0 += *reinterpret_cast<const Floats8*>(x);
      s1 += *reinterpret_cast<const Floats8*>(x + 8);
      s2 += *reinterpret_cast<const Floats8*>(x + 16);
      s3 += *reinterpret_cast<const Floats8*>(x + 24);
    }
    if (kScale == Scale::kMultiply) {
      s0 *= factor;
      s1 *= factor;
      s2 *= factor;
      s3 *= factor;
    } else if (kScale == Scale::kDivide) {
      s0 /= factor;
      s1 /= factor;
      s2 /= factor;
      s3 /= factor;
    }
    *reinterpret_cast<Floats8*>(out + i) = s0;
    *reinterpret_cast<Floats8*>(out + i + 8) = s1;
    *reinterpret_cast<Floats8*>(out + i + 16) = s2;
    *reinterpret_cast<Floats8*>(out + i + 24) = s3;
  }
  return i;
}

template <int kInputs>
__attribute__((always_inline)) inline int64_t SumBlocksScaled(
    float* out, const float* const* in, int inputs, int64_t n, Scale scale,
    float factor) {
  switch (scale) {
    case Scale::kNone:
      return SumBlocks<Scale::kNone, kInputs>(out, in, inputs, n, factor);
    case Scale::kMultiply:
      return SumBlocks<Scale::kMultiply, kInputs>(out, in, inputs, n, factor);
    case Scale::kDivide:
      return SumBlocks<Scale::kDivide, kInputs>(out, in, inputs, n, factor);
  }
  return 0;
}

// out[i] = (((in[0][i] + in[1][i]) + in[2][i]) + ...) / divisor for i in
// [0, n): one fixed order, whatever the vector width (additions and the
// division lane by lane round as the scalar ones do), so every rank and
// every clone gets the same bits. `out` may be one of the inputs. Written
// with explicit vectors: GCC -O2 leaves the plain loop scalar.
DDPRUN_VECTOR_CLONES
void SumInto(float* out, const float* const* in, int inputs, int64_t n,
             float divisor) {
  // Dividing by 2^k is multiplying by 2^-k exactly (both round the same real
  // number), and a multiplication costs a fraction of a division; other
  // divisors divide, so the bits are those of sum / divisor either way.
  int exponent = 0;
  Scale scale = Scale::kDivide;
  float factor = divisor;
  if (divisor == 1.0f) {
    scale = Scale::kNone;
  } else if (std::frexp(divisor, &exponent) == 0.5f && exponent > -125 &&
             exponent < 126) {
    scale = Scale::kMultiply;
    factor = 1.0f / divisor;
  }
  // Two inputs (two local ranks, the common case) get a loop of their own.
  int64_t i = inputs == 2
                  ? SumBlocksScaled<2>(out, in, inputs, n, scale, factor)
                  : SumBlocksScaled<0>(out, in, inputs, n, scale, factor);
  for (; i < n; ++i) {
    float sum = in[0][i];
    for (int k = 1; k < inputs; ++k) sum += in[k][i];
    out[i] = scale == Scale::kNone ? sum : sum / divisor;
  }
}

// out[i] = in[i] / divisor (a copy when divisor is 1).
void CopyDivided(float* out, const float* in, int64_t n, float divisor) {
  if (divisor == 1.0f) {
    std::memcpy(out, in, n * sizeof(float));
  } else {
    SumInto(out, &in, 1, n, divisor);
  }
}

}  // namespace

struct alignas(64) ShmAllreduce::Counter {
  std::atomic<uint64_t> value{0};
};

struct ShmAllreduce::Header {
  uint64_t magic = kMagic;
  int32_t version = kVersion;
  int32_t local_size = 0;
  int64_t slice_floats = 0;
  int64_t buffer_floats = 0;
  // Every state change bumps `generation` and wakes its sleepers.
  alignas(64) std::atomic<uint32_t> generation{0};
  std::atomic<uint32_t> sleepers{0};
  alignas(64) std::atomic<int32_t> attached{0};
  // 0, or 1 + the local rank that failed first, with its message. The rank
  // that wins `failure_claimed` writes `failure`, then stores `failed`:
  // a rank that sees `failed` set reads the whole message, never an empty
  // or half-written one (a reader that looked between the store of the
  // rank and the copy of the text once saw "failed: " and nothing more).
  std::atomic<int32_t> failed{0};
  std::atomic<int32_t> failure_claimed{0};
  char failure[512] = {};
  int32_t pid[kMaxLocal] = {};
  std::atomic<int32_t> present[kMaxLocal] = {};
  // Per local rank: the last slice it copied in, reduced its chunk of
  // (reduce-scatter only), and was done with (copied out, or summed all
  // inputs of: its buffer set may be reused); `final` the last slice local
  // rank 0 brought back from the other nodes.
  Counter in_ready[kMaxLocal];
  Counter reduced[kMaxLocal];
  Counter copied[kMaxLocal];
  Counter final;
  // MapResident's steps per local rank (kResidentCreated, ...).
  Counter resident[kMaxLocal];
};

// One rank's parts for the current AllreduceInPlace call: where each lies
// in its resident buffer (in floats from its start), written before the
// rank's in_ready moves, read by the others until their `reduced` moves.
struct ShmAllreduce::PartTable {
  int32_t resident = 0;  // 1: every part lies in the resident buffer
  int32_t parts = 0;
  int64_t count = 0;  // floats over all parts
  int64_t offset[kMaxTableParts];
  int64_t length[kMaxTableParts];
};

namespace {

constexpr size_t HeaderBytes() {
  return (sizeof(ShmAllreduce::Header) + 4095) / 4096 * 4096;
}

}  // namespace

// The capacity of one buffer: a slice, or at 2 local ranks a whole call of
// up to whole_call_floats.
static int64_t BufferFloats(const ShmAllreduceOptions& o) {
  if (o.local_size > kEachSumsAllMaxRanks) return o.slice_floats;
  const int64_t whole =
      (o.whole_call_floats + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  return std::max(o.slice_floats, whole);
}

static size_t BuffersBytes(const ShmAllreduceOptions& o) {
  // kBuffers buffer sets of local_size inputs and one output each.
  return kBuffers * static_cast<size_t>(o.local_size + 1) *
         static_cast<size_t>(BufferFloats(o)) * sizeof(float);
}

static size_t TableBytes() {
  return (sizeof(ShmAllreduce::PartTable) + 63) / 64 * 64;
}

static size_t SegmentBytes(const ShmAllreduceOptions& o) {
  // Then one part table per local rank (AllreduceInPlace).
  return HeaderBytes() + BuffersBytes(o) +
         static_cast<size_t>(o.local_size) * TableBytes();
}

// A resident buffer's file: whole pages.
static size_t ResidentBytes(int64_t floats) {
  return (static_cast<size_t>(floats) * sizeof(float) + 4095) / 4096 * 4096;
}

static absl::Status CheckOptions(const ShmAllreduceOptions& o) {
  if (o.local_size < 1 || o.local_size > kMaxLocal || o.local_rank < 0 ||
      o.local_rank >= o.local_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shared-memory allreduce: local rank %d of %d is out of range (at "
        "most %d local ranks)",
        o.local_rank, o.local_size, kMaxLocal));
  }
  if (o.slice_floats < kAlignFloats || o.slice_floats % kAlignFloats != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shared-memory allreduce: slice of %d floats; use a multiple of %d",
        o.slice_floats, kAlignFloats));
  }
  if (o.whole_call_floats < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shared-memory allreduce: whole calls of %d floats; use 0 (always "
        "slices) or more",
        o.whole_call_floats));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ShmAllreduce>> ShmAllreduce::Create(
    const ShmAllreduceOptions& options) {
  if (absl::Status ok = CheckOptions(options); !ok.ok()) return ok;
  const std::string path = options.dir + "/" + options.name;
  const std::string temp = path + ".creating";
  const size_t size = SegmentBytes(options);
  int fd = open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("create", temp, errno);
  auto give_up = [&](absl::Status status) {
    close(fd);
    unlink(temp.c_str());
    return status;
  };
  if (int error = posix_fallocate(fd, 0, static_cast<off_t>(size));
      error != 0) {
    return give_up(
        Errno(absl::StrFormat("reserve %d bytes for", size), temp, error));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return give_up(Errno("map", temp, errno));
  auto* header = new (base) Header();
  header->local_size = options.local_size;
  header->slice_floats = options.slice_floats;
  header->buffer_floats = BufferFloats(options);
  if (rename(temp.c_str(), path.c_str()) != 0) {
    munmap(base, size);
    return give_up(Errno("publish", path, errno));
  }
  std::unique_ptr<ShmAllreduce> shm(
      new ShmAllreduce(options, path, fd, base, size));
  if (absl::Status joined = shm->Join(); !joined.ok()) return joined;
  return shm;
}

absl::StatusOr<std::unique_ptr<ShmAllreduce>> ShmAllreduce::Attach(
    const ShmAllreduceOptions& options) {
  if (absl::Status ok = CheckOptions(options); !ok.ok()) return ok;
  const std::string path = options.dir + "/" + options.name;
  const size_t size = SegmentBytes(options);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Errno("open", path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != size) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "shared-memory allreduce: %s has %d bytes, expected %d: local ranks "
        "disagree on the local world size",
        path, st.st_size, size));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    int error = errno;
    close(fd);
    return Errno("map", path, error);
  }
  std::unique_ptr<ShmAllreduce> shm(
      new ShmAllreduce(options, path, fd, base, size));
  const Header& h = *shm->header_;
  if (h.magic != kMagic || h.version != kVersion ||
      h.local_size != options.local_size ||
      h.slice_floats != options.slice_floats ||
      h.buffer_floats != BufferFloats(options)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "shared-memory allreduce: %s is not this group's segment (local "
        "size %d, expected %d)",
        path, h.local_size, options.local_size));
  }
  if (absl::Status joined = shm->Join(); !joined.ok()) return joined;
  return shm;
}

ShmAllreduce::ShmAllreduce(const ShmAllreduceOptions& options, std::string path,
                           int fd, void* base, size_t size)
    : options_(options),
      path_(std::move(path)),
      fd_(fd),
      base_(base),
      size_(size),
      header_(static_cast<Header*>(base)),
      buffer_floats_(BufferFloats(options)) {}

ShmAllreduce::~ShmAllreduce() {
  // This rank's own buffer goes with own_resident_ (tensors may hold it).
  for (int r = 0; r < static_cast<int>(residents_.size()); ++r) {
    if (r != options_.local_rank && residents_[r] != nullptr) {
      munmap(residents_[r], ResidentBytes(resident_floats_));
    }
  }
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);  // releases this rank's lock
}

absl::Status ShmAllreduce::Join() {
  // A lock on byte `local_rank` of the file, held as long as this process
  // has it open: the kernel releases it when the process dies, however it
  // dies, which is how the others tell a dead rank from a slow one. (An
  // open-file-description lock: closing other descriptors keeps it.)
  struct flock lock = {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = options_.local_rank;
  lock.l_len = 1;
  if (fcntl(fd_, F_OFD_SETLK, &lock) != 0) {
    return Errno(
        absl::StrFormat("lock (local rank %d) in", options_.local_rank), path_,
        errno);
  }
  header_->pid[options_.local_rank] = static_cast<int32_t>(getpid());
  header_->present[options_.local_rank].store(1, std::memory_order_release);
  // The last rank to map the file removes its name: from then on it lives
  // exactly as long as some rank has it mapped.
  if (header_->attached.fetch_add(1) + 1 == options_.local_size) {
    unlink(path_.c_str());
  }
  Signal();
  return absl::OkStatus();
}

bool ShmAllreduce::PeerAlive(int local_rank) const {
  if (header_->present[local_rank].load(std::memory_order_acquire) == 0) {
    return true;  // not arrived yet: the timeout covers it
  }
  struct flock probe = {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_start = local_rank;
  probe.l_len = 1;
  if (fcntl(fd_, F_OFD_GETLK, &probe) != 0) return true;
  return probe.l_type != F_UNLCK;
}

void ShmAllreduce::Signal() {
  // Pairs with the fence in WaitFor's sleep (a Dekker handshake): either a
  // waiter about to sleep sees what this rank stored before calling Signal,
  // or this load sees its `sleepers` increment and wakes it. While nobody
  // sleeps (the common case: waiters spin) a signal touches no line that
  // another rank writes, so it costs no transfer between cores.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (header_->sleepers.load(std::memory_order_relaxed) > 0) {
    header_->generation.fetch_add(1);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&header_->generation),
            FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

absl::Status ShmAllreduce::Fail(absl::Status status) {
  if (failed_.ok()) failed_ = status;
  int32_t none = 0;
  if (header_->failure_claimed.compare_exchange_strong(none, 1)) {
    std::string message(status.message());
    std::strncpy(header_->failure, message.c_str(),
                 sizeof(header_->failure) - 1);
    header_->failed.store(options_.local_rank + 1);  // publishes the text
    Signal();
  }
  return failed_;
}

void ShmAllreduce::Abort(const std::string& message) {
  (void)Fail(absl::InternalError(message));
}

absl::Status ShmAllreduce::WaitFor(absl::FunctionRef<int()> laggard,
                                   const char* phase) {
  int waiting_for = laggard();
  if (waiting_for < 0) return absl::OkStatus();
  for (int i = 0; i < kPauseSpins; ++i) {
    CpuRelax();
    if ((waiting_for = laggard()) < 0) {
      ++stats_.waits_spun;
      return absl::OkStatus();
    }
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  while (Clock::now() - start < kSpinTime) {
    for (int i = 0; i < kPauseSpins; ++i) {
      if ((waiting_for = laggard()) < 0) {
        ++stats_.waits_spun_long;
        return absl::OkStatus();
      }
      CpuRelax();
    }
  }
  const Clock::time_point deadline = start + options_.timeout;
  ++stats_.waits_slept;  // counted once, when the first sleep is near
  while (true) {
    if ((waiting_for = laggard()) < 0) return absl::OkStatus();
    // In-place recovery (worker/recovery.h): the agent announced a new
    // round, so the peer waited for may never come.
    if (CollectiveAbortRequested()) {
      return Fail(absl::AbortedError(absl::StrFormat(
          "gradient allreduce: local rank %d aborted %s: the group changed "
          "(ddprun announced a new round)",
          options_.local_rank, phase)));
    }
    if (int32_t who = header_->failed.load(); who != 0) {
      if (!failed_.ok()) return failed_;
      failed_ = absl::AbortedError(absl::StrFormat(
          "gradient allreduce: local rank %d failed: %s", who - 1,
          std::string(header_->failure,
                      strnlen(header_->failure, sizeof(header_->failure)))));
      return failed_;
    }
    // Only the rank waited for, and only if it still has not arrived after
    // the probe: a peer that is past this point may have finished its last
    // call and closed the segment (its lock gone, as a dead rank's), even
    // the one `laggard` named, while this thread was off its core between
    // the two looks. Checking every peer failed such a call, and with it
    // every rank's (ShmAllreduceTest at 5 and 8 thread ranks on 2 cores,
    // 7 runs in 120). A dead rank further behind is found once it is the
    // first one waited for.
    if (!PeerAlive(waiting_for)) {
      const int still = laggard();
      if (still < 0) return absl::OkStatus();
      if (still == waiting_for) {
        return Fail(absl::UnavailableError(absl::StrFormat(
            "gradient allreduce: local rank %d (pid %d) died while local "
            "rank %d waited for it (%s, shared segment %s); its own log or "
            "exit status says why",
            waiting_for, header_->pid[waiting_for], options_.local_rank, phase,
            path_)));
      }
      continue;  // it arrived before it went; wait for the next one
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      const int pid = header_->pid[waiting_for];
      const char state = pid > 0 ? ProcessState(pid) : '?';
      return Fail(absl::DeadlineExceededError(absl::StrFormat(
          "gradient allreduce: local rank %d waited %d ms for local rank %d "
          "(pid %d%s, %s) and gave up; %s; raise the process group's "
          "timeout if this rank is only slow",
          options_.local_rank,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - start)
              .count(),
          waiting_for, pid,
          pid <= 0 ? ", never arrived"
                   : (state == 'T' || state == 't' ? ", stopped" : ""),
          phase,
          state == 'T' || state == 't'
              ? "it is stopped (SIGSTOP or a debugger)"
              : "it is hung or not calling the same allreduces")));
    }
    const auto nap = std::min<Clock::duration>(kLivenessPeriod, deadline - now);
    struct timespec ts;
    ts.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(nap).count();
    ts.tv_nsec =
        std::chrono::duration_cast<std::chrono::nanoseconds>(nap).count() %
        1000000000;
    // Announce the sleep, then look once more (see Signal): a rank that
    // signals after this sees the announcement and bumps `generation`.
    header_->sleepers.fetch_add(1);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t generation = header_->generation.load();
    if (laggard() >= 0 && header_->failed.load() == 0) {
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&header_->generation),
              FUTEX_WAIT, generation, &ts, nullptr, 0);
    }
    header_->sleepers.fetch_sub(1);
  }
}

float* ShmAllreduce::Input(int buffer, int local_rank) const {
  auto* data =
      reinterpret_cast<float*>(static_cast<char*>(base_) + HeaderBytes());
  return data + (static_cast<int64_t>(buffer) * (options_.local_size + 1) +
                 local_rank) *
                    buffer_floats_;
}

float* ShmAllreduce::Output(int buffer) const {
  return Input(buffer, options_.local_size);
}

ShmAllreduce::PartTable* ShmAllreduce::Table(int local_rank) const {
  char* tables =
      static_cast<char*>(base_) + HeaderBytes() + BuffersBytes(options_);
  return reinterpret_cast<PartTable*>(tables + local_rank * TableBytes());
}

// The pieces of the caller's parts that make up one slice, in order; `at`
// is a piece's offset in the slice.
class ShmAllreduce::Pieces {
 public:
  struct Piece {
    float* data;
    int64_t at;
    int64_t count;
  };

  // Takes the next `n` floats of `parts` from (part, offset) on.
  Pieces(absl::Span<const Part> parts, size_t& part, int64_t& offset,
         int64_t n) {
    int64_t at = 0;
    while (at < n) {
      const Part& p = parts[part];
      const int64_t take = std::min(n - at, p.count - offset);
      if (take > 0) pieces_.push_back({p.data + offset, at, take});
      at += take;
      offset += take;
      if (offset == p.count) {
        ++part;
        offset = 0;
      }
    }
  }

  // Calls fn(data, at, count) for the pieces' overlap with [lo, hi).
  template <typename Fn>
  void ForRange(int64_t lo, int64_t hi, Fn fn) const {
    for (const Piece& p : pieces_) {
      const int64_t a = std::max(lo, p.at);
      const int64_t b = std::min(hi, p.at + p.count);
      if (a < b) fn(p.data + (a - p.at), a, b - a);
    }
  }

 private:
  // Inline: a slice rarely spans more than a few parts, and a call of one
  // slice should not allocate.
  absl::InlinedVector<Piece, 4> pieces_;
};

bool ShmAllreduce::WholeCall(int64_t count, bool between_nodes) const {
  return !between_nodes && options_.local_size == kEachSumsAllMaxRanks &&
         count <= options_.whole_call_floats;
}

bool ShmAllreduce::EachSumsAll(int64_t n, bool between_nodes) const {
  return !between_nodes && (options_.local_size <= kEachSumsAllMaxRanks ||
                            n <= kEachSumsAllMaxFloats);
}

absl::Status ShmAllreduce::Allreduce(float* data, int64_t count,
                                     const BetweenNodes& between_nodes) {
  const Part whole{data, count};
  return Allreduce(absl::MakeConstSpan(&whole, 1), 1.0f, between_nodes);
}

absl::Status ShmAllreduce::Allreduce(absl::Span<const Part> parts,
                                     float divisor,
                                     const BetweenNodes& between_nodes) {
  if (!failed_.ok()) return failed_;
  int64_t count = 0;
  for (const Part& p : parts) count += std::max<int64_t>(0, p.count);
  const int size = options_.local_size;
  const bool whole = WholeCall(count, static_cast<bool>(between_nodes));
  const int64_t slice = whole ? count : options_.slice_floats;
  if (whole && count > 0) ++stats_.whole_calls;
  size_t part = 0;
  int64_t part_offset = 0;
  while (part < parts.size() && parts[part].count <= 0) ++part;
  // This buffer set held slice seq-kBuffers: free once every rank is done
  // with it.
  auto buffer_free = [&](uint64_t seq) {
    if (seq <= kBuffers) return absl::OkStatus();
    return WaitFor([&] { return FirstBelow(header_->copied, seq - kBuffers); },
                   "for the previous slice to be copied out");
  };
  if (options_.pipeline && !whole && count > slice && !between_nodes &&
      size >= 2 && size <= kEachSumsAllMaxRanks) {
    // Each-sums-all, one slice's copy-in ahead of its sum: a rank copies
    // slice s+1 in before it waits for the others' slice s, so the wait
    // finds it there unless a peer fell a whole slice behind (in lockstep
    // about a third of a 64 MB call's 512 waits had to spin).
    std::optional<Pieces> summing;
    int64_t summing_n = 0;
    uint64_t summing_seq = 0;
    for (int64_t offset = 0; offset < count || summing; offset += slice) {
      std::optional<Pieces> copying;
      const int64_t n = std::min(slice, count - offset);
      const uint64_t seq = offset < count ? ++seq_ : 0;
      if (offset < count) {
        copying.emplace(parts, part, part_offset, n);
        if (absl::Status free = buffer_free(seq); !free.ok()) return free;
        CopyIn(*copying, n, seq);
      }
      if (summing) {
        absl::Status done = SumAll(*summing, summing_n, summing_seq, divisor);
        if (!done.ok()) return done;
        ++stats_.each_sums_all_slices;
        ++stats_.pipelined_slices;
      }
      summing = std::move(copying);
      summing_n = n;
      summing_seq = seq;
    }
    return absl::OkStatus();
  }
  for (int64_t offset = 0; offset < count; offset += slice) {
    const int64_t n = std::min(slice, count - offset);
    const Pieces mine(parts, part, part_offset, n);
    const uint64_t seq = ++seq_;
    if (absl::Status free = buffer_free(seq); !free.ok()) return free;
    absl::Status done;
    if (size == 1 && !between_nodes) {
      if (divisor != 1.0f) {
        mine.ForRange(0, n, [&](float* d, int64_t, int64_t k) {
          CopyDivided(d, d, k, divisor);
        });
      }
      header_->copied[0].value.store(seq, std::memory_order_release);
    } else if (EachSumsAll(n, static_cast<bool>(between_nodes))) {
      done = SliceEachSumsAll(mine, n, seq, divisor);
      ++stats_.each_sums_all_slices;
    } else {
      done = SliceScattered(mine, n, seq, divisor, between_nodes);
      ++stats_.scattered_slices;
    }
    if (!done.ok()) return done;
  }
  return absl::OkStatus();
}

absl::Status ShmAllreduce::AllreduceInPlace(absl::Span<const Part> parts,
                                            float divisor) {
  if (!failed_.ok()) return failed_;
  int64_t count = 0;
  for (const Part& p : parts) count += std::max<int64_t>(0, p.count);
  if (count == 0) return absl::OkStatus();  // the same on every rank
  const int size = options_.local_size;
  const int me = options_.local_rank;
  if (size == 1 || residents_.empty()) return Allreduce(parts, divisor);
  // This rank's table: where its parts lie, or that one does not.
  PartTable& mine = *Table(me);
  const float* lo = residents_[me];
  const float* hi = lo + resident_floats_;
  mine.resident = parts.size() <= static_cast<size_t>(kMaxTableParts);
  mine.parts = static_cast<int32_t>(parts.size());
  mine.count = count;
  for (size_t i = 0; i < parts.size() && mine.resident; ++i) {
    const Part& p = parts[i];
    const int64_t n = std::max<int64_t>(0, p.count);
    mine.length[i] = n;
    if (n == 0) {  // nothing to read or write (its pointer may be null)
      mine.offset[i] = 0;
      continue;
    }
    if (p.data < lo || p.data + n > hi) {
      mine.resident = 0;
      break;
    }
    mine.offset[i] = p.data - lo;
  }
  // One slice number for the exchange, as every rank counts it.
  Header& h = *header_;
  const uint64_t seq = ++seq_;
  h.in_ready[me].value.store(seq, std::memory_order_release);
  Signal();
  absl::Status ready = WaitFor([&] { return FirstBelow(h.in_ready, seq); },
                               "for the others' part tables");
  if (!ready.ok()) return ready;
  bool in_place = true;
  for (int r = 0; r < size && in_place; ++r) {
    const PartTable& t = *Table(r);
    in_place = t.resident == 1 && t.parts == mine.parts && t.count == count;
    for (int i = 0; i < t.parts && in_place; ++i) {
      in_place = t.length[i] == mine.length[i];
    }
  }
  if (!in_place) {
    // Every rank read the same tables and decided the same: all copy. The
    // exchange used no buffer set; its slice is done.
    h.reduced[me].value.store(seq, std::memory_order_release);
    h.copied[me].value.store(seq, std::memory_order_release);
    Signal();
    ++stats_.in_place_fallbacks;
    return Allreduce(parts, divisor);
  }
  absl::Status summed = SumInPlace(parts, count, seq, divisor);
  if (!summed.ok()) return summed;
  ++stats_.in_place_calls;
  return absl::OkStatus();
}

absl::Status ShmAllreduce::SumInPlace(absl::Span<const Part> parts,
                                      int64_t count, uint64_t seq,
                                      float divisor) {
  // Local rank r sums elements [chunk * r, chunk * (r + 1)) of the call,
  // reading every rank's parts where its table says they lie, into its own
  // part and then into the others' (nobody else reads or writes those
  // elements). In pieces of a slice: a piece's sum is still in this core's
  // cache when it is copied to the others.
  Header& h = *header_;
  const int size = options_.local_size;
  const int me = options_.local_rank;
  const int64_t chunk = ((count + size - 1) / size + kAlignFloats - 1) /
                        kAlignFloats * kAlignFloats;
  const int64_t lo = std::min(count, chunk * me);
  const int64_t hi = std::min(count, lo + chunk);
  const PartTable* tables[kMaxLocal];
  for (int r = 0; r < size; ++r) tables[r] = Table(r);
  int64_t start = 0;  // the part's first element in the call
  for (size_t i = 0; i < parts.size() && start < hi; ++i) {
    const int64_t n = std::max<int64_t>(0, parts[i].count);
    const int64_t a = std::max(lo, start);
    const int64_t b = std::min(hi, start + n);
    for (int64_t at = a; at < b; at += options_.slice_floats) {
      const int64_t k = std::min(options_.slice_floats, b - at);
      const int64_t within = at - start;
      const float* inputs[kMaxLocal];
      for (int r = 0; r < size; ++r) {
        inputs[r] = residents_[r] + tables[r]->offset[i] + within;
      }
      float* out = parts[i].data + within;
      SumInto(out, inputs, size, k, divisor);
      for (int r = 0; r < size; ++r) {
        if (r != me) {
          std::memcpy(residents_[r] + tables[r]->offset[i] + within, out,
                      k * sizeof(float));
        }
      }
    }
    start += n;
  }
  // Once every rank says it reduced, every rank's parts hold the whole
  // result and nobody reads or writes another's: the caller may write its
  // own again at once, and the next call may rewrite this rank's table.
  h.reduced[me].value.store(seq, std::memory_order_release);
  Signal();
  absl::Status reduced = WaitFor([&] { return FirstBelow(h.reduced, seq); },
                                 "for its chunk of the sum");
  if (!reduced.ok()) return reduced;
  h.copied[me].value.store(seq, std::memory_order_release);
  Signal();
  return absl::OkStatus();
}

absl::StatusOr<float*> ShmAllreduce::MapResident(int64_t floats) {
  if (!failed_.ok()) return failed_;
  if (header_->resident[options_.local_rank].value.load() != 0) {
    return absl::FailedPreconditionError(
        "shared-memory allreduce: MapResident called twice; one resident "
        "buffer per segment");
  }
  if (floats < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shared-memory allreduce: a resident buffer of %d floats; ask for "
        "at least 1",
        floats));
  }
  const int size = options_.local_size;
  const int me = options_.local_rank;
  const size_t bytes = ResidentBytes(floats);
  auto file = [this](int r) { return absl::StrFormat("%s.r%d", path_, r); };
  std::vector<float*> maps(size, nullptr);
  auto give_up = [&](absl::Status status) -> absl::Status {
    for (float* m : maps) {
      if (m != nullptr) munmap(m, bytes);
    }
    unlink(file(me).c_str());
    return Fail(std::move(status));
  };
  // This rank's own buffer: a file of its own (space reserved up front, so
  // a full tmpfs is an error here, not a SIGBUS in backward).
  absl::Status reserved;
  {
    const std::string mine = file(me);
    int fd = open(mine.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int error =
        fd < 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    void* map = error != 0 ? MAP_FAILED
                           : mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                  MAP_SHARED, fd, 0);
    if (map == MAP_FAILED && error == 0) error = errno;
    if (fd >= 0) close(fd);
    if (map == MAP_FAILED) {
      reserved = Errno(absl::StrFormat("reserve and map %d bytes for", bytes),
                       mine, error);
    } else {
      maps[me] = static_cast<float*>(map);
    }
  }
  // Every rank says whether it has its buffer; one that could not (a full
  // tmpfs) makes every rank return an error and leaves the group usable.
  header_->resident[me].value.store(
      reserved.ok() ? kResidentCreated : kResidentRefused,
      std::memory_order_release);
  Signal();
  absl::Status created =
      WaitFor([&] { return FirstBelow(header_->resident, kResidentCreated); },
              "for the others' resident buffers");
  if (!created.ok()) return give_up(created);
  for (int r = 0; r < size; ++r) {
    if (header_->resident[r].value.load(std::memory_order_acquire) ==
        kResidentRefused) {
      for (float*& m : maps) {
        if (m != nullptr) munmap(m, bytes);
        m = nullptr;
      }
      unlink(file(me).c_str());
      if (!reserved.ok()) return reserved;
      return absl::ResourceExhaustedError(absl::StrFormat(
          "shared-memory allreduce: local rank %d could not reserve its "
          "resident buffer of %d bytes (its log says why)",
          r, bytes));
    }
  }
  // The others' buffers, writable: this rank reads its chunk of theirs and
  // writes its summed chunk back into them (SumInPlace).
  for (int r = 0; r < size; ++r) {
    if (r == me) continue;
    const std::string theirs = file(r);
    int fd = open(theirs.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return give_up(Errno("open", theirs, errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      close(fd);
      return give_up(absl::FailedPreconditionError(absl::StrFormat(
          "shared-memory allreduce: %s has %d bytes, expected %d: local "
          "ranks asked for resident buffers of different sizes",
          theirs, st.st_size, bytes)));
    }
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int error = errno;
    close(fd);
    if (map == MAP_FAILED) return give_up(Errno("map", theirs, error));
    maps[r] = static_cast<float*>(map);
  }
  header_->resident[me].value.store(kResidentMapped, std::memory_order_release);
  Signal();
  absl::Status mapped =
      WaitFor([&] { return FirstBelow(header_->resident, kResidentMapped); },
              "for the others to map the resident buffers");
  if (!mapped.ok()) return give_up(mapped);
  // Every rank mapped it: the name can go, the memory goes with the last
  // mapping (the rank's death included).
  unlink(file(me).c_str());
  residents_ = std::move(maps);
  resident_floats_ = floats;
  own_resident_ = std::shared_ptr<void>(
      residents_[me], [bytes](void* buffer) { munmap(buffer, bytes); });
  return residents_[me];
}

int ShmAllreduce::FirstBelow(const Counter* counters, uint64_t target) const {
  for (int r = 0; r < options_.local_size; ++r) {
    if (counters[r].value.load(std::memory_order_acquire) < target) return r;
  }
  return -1;
}

absl::Status ShmAllreduce::SliceEachSumsAll(const Pieces& mine, int64_t n,
                                            uint64_t seq, float divisor) {
  // Every rank copies its slice in, waits for the others', and sums all
  // inputs into its own buffer, reading its own part from there: one wait,
  // and at 2 ranks the same bytes as reduce-scatter + all-gather.
  CopyIn(mine, n, seq);
  return SumAll(mine, n, seq, divisor);
}

void ShmAllreduce::CopyIn(const Pieces& mine, int64_t n, uint64_t seq) {
  const int me = options_.local_rank;
  float* in = Input(static_cast<int>(seq % kBuffers), me);
  mine.ForRange(0, n, [in](float* d, int64_t at, int64_t k) {
    std::memcpy(in + at, d, k * sizeof(float));
  });
  header_->in_ready[me].value.store(seq, std::memory_order_release);
  Signal();
}

absl::Status ShmAllreduce::SumAll(const Pieces& mine, int64_t n, uint64_t seq,
                                  float divisor) {
  Header& h = *header_;
  const int size = options_.local_size;
  const int me = options_.local_rank;
  const int buffer = static_cast<int>(seq % kBuffers);
  absl::Status ready = WaitFor([&] { return FirstBelow(h.in_ready, seq); },
                               "for its input to the shared segment");
  if (!ready.ok()) return ready;
  mine.ForRange(0, n, [&](float* d, int64_t at, int64_t k) {
    const float* inputs[kMaxLocal];
    for (int r = 0; r < size; ++r)
      inputs[r] = r == me ? d : Input(buffer, r) + at;
    SumInto(d, inputs, size, k, divisor);
  });
  h.copied[me].value.store(seq, std::memory_order_release);
  Signal();
  return absl::OkStatus();
}

absl::Status ShmAllreduce::SliceScattered(const Pieces& mine, int64_t n,
                                          uint64_t seq, float divisor,
                                          const BetweenNodes& between_nodes) {
  // Reduce-scatter, then all-gather: chunk r of the slice is local rank r's
  // to reduce. Its own chunk a rank reads from its own buffer: only the
  // others' chunks are copied in.
  Header& h = *header_;
  const int size = options_.local_size;
  const int me = options_.local_rank;
  const int buffer = static_cast<int>(seq % kBuffers);
  const int64_t chunk =
      ((n + size - 1) / size + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  const int64_t lo = std::min(n, chunk * me);
  const int64_t hi = std::min(n, lo + chunk);
  float* in = Input(buffer, me);
  float* out = Output(buffer);
  auto copy_in = [in](float* d, int64_t at, int64_t k) {
    std::memcpy(in + at, d, k * sizeof(float));
  };
  mine.ForRange(0, lo, copy_in);
  mine.ForRange(hi, n, copy_in);
  h.in_ready[me].value.store(seq, std::memory_order_release);
  Signal();

  absl::Status ready = WaitFor([&] { return FirstBelow(h.in_ready, seq); },
                               "for its input to the shared segment");
  if (!ready.ok()) return ready;
  mine.ForRange(lo, hi, [&](float* d, int64_t at, int64_t k) {
    const float* inputs[kMaxLocal];
    for (int r = 0; r < size; ++r)
      inputs[r] = r == me ? d : Input(buffer, r) + at;
    SumInto(out + at, inputs, size, k, 1.0f);
  });
  auto copy_out = [out, divisor](float* d, int64_t at, int64_t k) {
    CopyDivided(d, out + at, k, divisor);
  };
  // Still in this core's cache: the own chunk goes out at once.
  if (!between_nodes) mine.ForRange(lo, hi, copy_out);
  h.reduced[me].value.store(seq, std::memory_order_release);
  Signal();

  if (between_nodes && me == 0) {
    absl::Status local = WaitFor([&] { return FirstBelow(h.reduced, seq); },
                                 "for its chunk of the sum");
    if (!local.ok()) return local;
    absl::Status across = between_nodes(out, n);
    if (!across.ok()) return Fail(across);
    h.final.value.store(seq, std::memory_order_release);
    Signal();
  } else if (between_nodes) {
    absl::Status across = WaitFor(
        [&h, seq] {
          return h.final.value.load(std::memory_order_acquire) < seq ? 0 : -1;
        },
        "for the sum over the nodes");
    if (!across.ok()) return across;
  } else {
    absl::Status local = WaitFor([&] { return FirstBelow(h.reduced, seq); },
                                 "for its chunk of the sum");
    if (!local.ok()) return local;
  }
  if (between_nodes) {
    mine.ForRange(0, n, copy_out);
  } else {
    mine.ForRange(0, lo, copy_out);
    mine.ForRange(hi, n, copy_out);
  }
  h.copied[me].value.store(seq, std::memory_order_release);
  Signal();
  return absl::OkStatus();
}

}  // namespace ddprun::worker
