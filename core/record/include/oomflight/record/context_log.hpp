// A rank's context, for the archive: its environment (captured once at start) and the metadata the job sets as
// it goes (epoch, learning rate, batch size, sequence length), each with the batch at which it was set. Values
// of secret-looking names are redacted before they are stored (oomflight/base/redact.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "oomflight/api.h"

namespace oomflight {

/// One key/value pair of a rank's context.
struct ContextEntry {
  /// environment: captured at start; metadata: set by the job. The other two describe a PyTorch snapshot the rank
  /// was imported from, so that the memory_viz export gives it back as it was:
  /// - snapshot_field: a top-level key of the snapshot other than `segments` and `device_traces` (PyTorch's
  ///   `allocator_settings`, `external_annotations`, any newer one); the value is that key's value pickled
  ///   (protocol 4, a whole pickle) in base64 (the string table holds text): `pickle.loads(base64.b64decode(v))`;
  /// - snapshot_layout: key "trace", "segment" or "block"; the value lists, comma-separated, the optional keys
  ///   that the snapshot's entries of that kind did not have ("time_us": older PyTorch), which the export then
  ///   leaves out too; key "trace.NAME": a key every trace entry had with one value (PyTorch 2.6's
  ///   `compile_context` "N/A", `user_metadata` ""), that value pickled in base64, which the export puts on every
  ///   entry.
  enum class Kind : std::uint8_t { environment = 0, metadata = 1, snapshot_field = 2, snapshot_layout = 3 };
  static constexpr int kKindCount = 4;
  Kind kind = Kind::metadata;
  std::int64_t batch = -1;  ///< the batch at which it was set (-1: before the first batch)
  std::string key;
  std::string value;        ///< "<redacted>" when the key looks secret
};

/// Thread-safety: every member takes the log's mutex (metadata is set a few times per batch at most).
class OOMFLIGHT_API ContextLog {
 public:
  /// Keeps the newest `max_metadata` metadata entries (older ones are dropped and counted).
  explicit ContextLog(std::size_t max_metadata = 4096) : max_metadata_(max_metadata) {}

  /// Replaces the environment entries. Values are redacted by key here.
  void set_environment(std::vector<ContextEntry> entries);
  /// Adds a metadata entry set at `batch`; the value is redacted when the key looks secret.
  void set_metadata(std::string_view key, std::string_view value, std::int64_t batch);
  /// The environment, then the metadata in the order set.
  std::vector<ContextEntry> copy() const;
  /// Metadata entries dropped because more than max_metadata were set.
  std::uint64_t dropped() const;

 private:
  mutable std::mutex mutex_;
  std::size_t max_metadata_;
  std::vector<ContextEntry> environment_;
  std::deque<ContextEntry> metadata_;
  std::uint64_t dropped_ = 0;
};

}  // namespace oomflight
