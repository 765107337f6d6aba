// EventClock: the choice of source, the anchors and the tick -> ns line.
#include "oomflight/record/event_clock.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace oomflight {
namespace {
__extension__ using U128 = unsigned __int128;  // GCC and Clang: ns x 2^64 needs more than 64 bits
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

TickConversion::TickConversion(const ClockAnchor& first, const ClockAnchor& later) noexcept
    : kind_(Kind::line), first_ticks_(first.ticks), first_ns_(first.monotonic_ns) {
  const std::int64_t ticks = later.ticks - first.ticks;
  const std::int64_t ns = later.monotonic_ns - first.monotonic_ns;
  if (ticks <= 0 || ns < 0) {  // cannot happen with an invariant TSC; never divide by zero
    kind_ = Kind::constant;
    first_ns_ = later.monotonic_ns;
    return;
  }
  // slope = ceil(ns x 2^64 / ticks): rounded up, so that ticks x slope >> 64 gives `ns` exactly at `later`
  // (the excess is below ticks / 2^64 of a nanosecond there, and at most 1 ns anywhere).
  const U128 slope = ((static_cast<U128>(ns) << 64) + static_cast<U128>(ticks) - 1) / static_cast<U128>(ticks);
  slope_hi_ = static_cast<std::uint64_t>(slope >> 64);
  slope_lo_ = static_cast<std::uint64_t>(slope);
}

TickConversion EventClock::conversion(const ClockAnchor& later) const noexcept {
  if (source_ == Source::monotonic) return {};
  return TickConversion(first_, later);
}

}  // namespace oomflight
