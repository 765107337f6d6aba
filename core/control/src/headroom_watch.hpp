// The headroom dump's check (issue 42, item 1; docs/protocol.md, "Before the OOM: the headroom dump"): whether a
// rank's memory crossed OOMFLIGHT_HEADROOM_DUMP's share of its limit, seen where its figures are published
// (Session::set_memory: oomflight_set_memory, which the PyTorch extension calls after each of its events), and the
// crossing kept for whoever runs this rank's dumps: the transport's watcher (take_signals), or the batch thread at
// the next batch's start where no watcher coordinates them. Internal to the control wing.
//
// Why not on the allocating thread: it is inside torch's allocator (its lock held), and a dump there would stall
// every other stream's allocations for the dump's length. Why a share of the limit and not of free memory: the free
// figure is the driver's, 0 in most publications, while reserved is what the caching allocator holds.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "oomflight/control/dump_request.hpp"
#include "oomflight/record/recorder.hpp"

namespace oomflight {

/// A rank's limit: its per-process cap where one is set below the device's capacity (torch's
/// set_per_process_memory_fraction), else the device's capacity; 0 when neither is known.
struct MemoryLimit {
  std::uint64_t bytes = 0;
  bool cap = false;
};
/// The limit of `m`'s figures. Pure.
MemoryLimit memory_limit(const MemoryStats& m) noexcept;

/// `share_ppm` parts per million of `limit` bytes, rounded down; no overflow for any limit below 2^64. Pure.
std::uint64_t share_of(std::uint64_t limit, std::uint32_t share_ppm) noexcept;

/// A share in parts per million as a percentage, as a user writes it: 900000 -> "90%", 925000 -> "92.5%". Pure.
std::string percent_text(std::uint32_t share_ppm);

class HeadroomWatch {
 public:
  /// How far below the threshold, in parts per million of the limit, a device's figure must fall before a second
  /// crossing counts: a figure that hovers at the threshold (empty_cache in every step) costs one dump, not one a
  /// batch.
  static constexpr std::uint32_t kRearmPpm = 50000;

  /// `share_ppm`: Config::headroom_ppm, 1 .. 1,000,000.
  explicit HeadroomWatch(std::uint32_t share_ppm) noexcept;

  /// `device`'s figures `m` were published during batch `batch`; `outside` is the device memory this process holds
  /// outside the caching allocator where known (0 when not), counted against the device's capacity, not against a
  /// cap (which bounds the allocator's reserved alone). When reserved + outside reaches the threshold and the
  /// device is armed (as every device is at first), the crossing is kept for take() and the device disarmed; a
  /// disarmed device is armed again once its figure falls kRearmPpm below the threshold. Figures whose reserved +
  /// outside is the one last observed for the device (an allocation's publication: reserved moves only with segment
  /// events) end at that compare. When a crossing of another
  /// device waits still, this one is not kept, and the device stays armed: its next figures try again. A device
  /// outside 0 .. kMaxDevices - 1, or without a known limit, is not checked. Lock-free and wait-free (a few loads, a
  /// compare, a multiplication); any thread. Never throws.
  void observe(int device, const MemoryStats& m, std::int64_t batch, std::uint64_t outside = 0) noexcept;

  /// Whether a crossing waits for take(). Any thread.
  bool pending() const noexcept { return slot_.load(std::memory_order_acquire) == kFull; }

  /// The crossing waiting, as the request of a dump of kind headroom (its device, batch, figures, and a reason that
  /// names them and the threshold), and clears it; nothing when none waits. Any thread, concurrent with observe()
  /// and with another take(): one of them gets the crossing. Throws std::bad_alloc (the reason's text); the crossing
  /// is then kept.
  std::optional<DumpRequest> take();

  std::uint32_t share_ppm() const noexcept { return share_ppm_; }

 private:
  struct Crossing {
    int device = -1;
    std::int64_t batch = -1;
    std::uint64_t reserved = 0, outside = 0, limit = 0, capacity = 0, cap = 0, device_free = 0;
    bool is_cap = false;
  };
  static constexpr int kEmpty = 0, kFilling = 1, kFull = 2, kTaking = 3;

  const std::uint32_t share_ppm_;
  std::array<std::atomic<bool>, kMaxDevices> armed_;
  std::array<std::atomic<std::uint64_t>, kMaxDevices> last_in_use_{};  // UINT64_MAX: none observed yet
  std::atomic<int> slot_{kEmpty};
  Crossing crossing_;  // written by the observer that moved slot_ to kFilling, read by take() after kFull
};

}  // namespace oomflight
