// EventClock: the choice of source, the anchors and the tick -> ns line.
#include "oomflight/record/event_clock.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace oomflight {
namespace {
__extension__ using Int128 = __int128;  // GCC and Clang: (ticks * ns) needs more than 64 bits
}  // namespace

bool EventClock::invariant_tsc() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (static_cast<unsigned>(__get_cpuid_max(0x80000000u, nullptr)) < 0x80000007u) return false;  // int in clang
  if (__get_cpuid(0x80000007u, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (edx & (1u << 8)) != 0;
#else
  return false;  // aarch64's cntvct_el0 would do; not built: CLOCK_MONOTONIC there
#endif
}

EventClock::EventClock(bool allow_tsc)
    : source_(allow_tsc && invariant_tsc() ? Source::tsc : Source::monotonic), first_(read_anchor()) {}

ClockAnchor EventClock::read_anchor() const noexcept {
  if (source_ == Source::monotonic) {
    const std::int64_t ns = monotonic_ns();
    return {ns, ns};
  }
  // The clock read between two tick reads: its ticks are their midpoint (the read takes ~26 ns, ~60 ticks).
  const std::int64_t before = now();
  const std::int64_t ns = monotonic_ns();
  const std::int64_t after = now();
  return {before + (after - before) / 2, ns};
}

ClockAnchor EventClock::anchor() const noexcept {
  ClockAnchor a = read_anchor();
  while (source_ == Source::tsc && a.monotonic_ns - first_.monotonic_ns < kMinAnchorSpanNs) a = read_anchor();
  return a;
}

std::int64_t EventClock::to_monotonic_ns(std::int64_t raw, const ClockAnchor& later) const noexcept {
  if (source_ == Source::monotonic) return raw;
  const std::int64_t ticks = later.ticks - first_.ticks;
  if (ticks <= 0) return later.monotonic_ns;  // cannot happen with an invariant TSC; never divide by zero
  const Int128 ns = static_cast<Int128>(raw - first_.ticks) * (later.monotonic_ns - first_.monotonic_ns);
  return first_.monotonic_ns + static_cast<std::int64_t>(ns / ticks);
}

}  // namespace oomflight
