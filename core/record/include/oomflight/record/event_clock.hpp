// The clock that stamps events on the hot path, and its conversion to CLOCK_MONOTONIC at freeze.
//
// A CLOCK_MONOTONIC read is a vDSO call: ~26 ns on a kvm-clock guest, more than the whole ring push. Where the
// CPU's time-stamp counter is invariant (CPUID 0x80000007 EDX bit 8: constant rate, runs in every C-state, the
// same on every core), events are stamped with rdtsc (~11 ns) instead, and freeze() maps ticks to monotonic ns
// with the line through two (tsc, CLOCK_MONOTONIC) anchors: one taken when the recorder starts, one at the freeze.
// Elsewhere (other CPUs, no invariant TSC, or when asked) events are stamped with CLOCK_MONOTONIC directly and the
// map is the identity. Either way the archive holds CLOCK_MONOTONIC ns (docs/performance.md, "hot path").
#pragma once

#include <cstdint>

#include "oomflight/api.h"
#include "oomflight/record/clock.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace oomflight {

/// One (raw tick, CLOCK_MONOTONIC ns) pair, read back to back.
struct ClockAnchor {
  std::int64_t ticks = 0;
  std::int64_t monotonic_ns = 0;
};

/// The tick -> CLOCK_MONOTONIC ns line through two anchors, as a 64.64 fixed-point multiply: converting a frozen
/// ring of 100,000 events costs one 128-bit division per freeze instead of one per event. Within 1 ns of the exact
/// line (the slope rounded up in its 64th fractional bit), exact at both anchors. Immutable; thread-safe.
class OOMFLIGHT_API TickConversion {
 public:
  TickConversion() = default;  ///< the identity (stamps are CLOCK_MONOTONIC ns already)
  /// The line through `first` and `later`. When later.ticks <= first.ticks or later's ns precede first's, no
  /// line can be drawn: every stamp then maps to later.monotonic_ns.
  TickConversion(const ClockAnchor& first, const ClockAnchor& later) noexcept;

  /// A raw stamp in CLOCK_MONOTONIC ns.
  std::int64_t operator()(std::int64_t raw) const noexcept {
    if (kind_ == Kind::identity) return raw;
    if (kind_ == Kind::constant) return first_ns_;
    if (raw >= first_ticks_) return first_ns_ + scale(static_cast<std::uint64_t>(raw - first_ticks_));
    return first_ns_ - scale(static_cast<std::uint64_t>(first_ticks_ - raw));
  }

 private:
  enum class Kind : std::uint8_t { identity, constant, line };
  // floor(ticks x slope), the slope in 64.64 fixed point: whole (hi) and fractional (lo) words.
  std::int64_t scale(std::uint64_t ticks) const noexcept {
    __extension__ using U128 = unsigned __int128;
    const U128 whole = static_cast<U128>(ticks) * slope_hi_;
    const std::uint64_t fraction = static_cast<std::uint64_t>((static_cast<U128>(ticks) * slope_lo_) >> 64);
    return static_cast<std::int64_t>(whole + fraction);
  }
  Kind kind_ = Kind::identity;
  std::int64_t first_ticks_ = 0;
  std::int64_t first_ns_ = 0;
  std::uint64_t slope_hi_ = 0;
  std::uint64_t slope_lo_ = 0;
};

/// Stamps events and converts the stamps. Thread-safety: now() and anchor() from any thread; the object is
/// immutable after construction.
class OOMFLIGHT_API EventClock {
 public:
  enum class Source : std::uint8_t {
    monotonic,  ///< stamps are CLOCK_MONOTONIC ns
    tsc,        ///< stamps are invariant-TSC ticks, converted at freeze
  };

  /// Uses the TSC when it is invariant and `allow_tsc` is true, CLOCK_MONOTONIC otherwise. Takes the first
  /// anchor.
  explicit EventClock(bool allow_tsc = true);

  /// A raw stamp now (ticks of source()). Wait-free, no system call.
  std::int64_t now() const noexcept {
#if defined(__x86_64__) || defined(__i386__)
    if (source_ == Source::tsc) return static_cast<std::int64_t>(__rdtsc());
#endif
    return monotonic_ns();
  }

  /// A fresh anchor. For a TSC clock, waits (spinning) until at least kMinAnchorSpanNs have passed since the first
  /// anchor so that the conversion's slope is measured over a span long enough to be exact to ~1e-5.
  ClockAnchor anchor() const noexcept;

  /// Converts a raw stamp to CLOCK_MONOTONIC ns with the line through the first anchor and `later`.
  std::int64_t to_monotonic_ns(std::int64_t raw, const ClockAnchor& later) const noexcept {
    return conversion(later)(raw);
  }

  /// The conversion to_monotonic_ns() applies, for many stamps at once.
  TickConversion conversion(const ClockAnchor& later) const noexcept;

  Source source() const noexcept { return source_; }
  const ClockAnchor& first_anchor() const noexcept { return first_; }

  /// Whether this CPU has an invariant TSC (x86 CPUID 0x80000007 EDX bit 8).
  static bool invariant_tsc() noexcept;

  static constexpr std::int64_t kMinAnchorSpanNs = 20'000'000;  ///< 20 ms

 private:
  ClockAnchor read_anchor() const noexcept;

  Source source_;
  ClockAnchor first_;
};

}  // namespace oomflight
