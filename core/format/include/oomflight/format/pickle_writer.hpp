// A writer for Python pickles of plain data, protocol 4, restricted to the opcodes that every reader of PyTorch
// memory snapshots accepts: CPython's pickle, oomflight's strict reader (pickle.hpp) and the unpickler of
// PyTorch's MemoryViz.js (torch/utils/viz/MemoryViz.js, which knows PROTO 2-4, MARK, STOP, the EMPTY_/TUPLE
// containers, APPEND(S), SETITEM(S), BININT/BININT1/BININT2, LONG1, BINFLOAT, SHORT_BINUNICODE, BINUNICODE,
// NONE, NEWTRUE, NEWFALSE, MEMOIZE, BINPUT, BINGET, LONG_BINGET and FRAME). Opcode encodings follow CPython's
// Lib/pickletools.py. No FRAME is written (framing is optional in protocol 4).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "oomflight/api.h"

namespace oomflight::pickle {

/// Builds one pickle in memory. The caller writes values in pickle order: a container is opened, its items (a
/// dict: key, value, key, value, ...) written, then closed. Errors in that order (closing what is not open,
/// finishing with a container open) throw std::logic_error. Not thread-safe; one writer per pickle.
class OOMFLIGHT_API Writer {
 public:
  /// Writes the PROTO 4 header.
  Writer();

  void none();
  void boolean(bool value);
  /// Any 64-bit integer: BININT1, BININT2 or BININT where they fit, else LONG1 (two's complement).
  void integer(std::int64_t value);
  /// Unsigned 64-bit integers (device addresses above 2^63 stay positive).
  void unsigned_integer(std::uint64_t value);
  /// A str (UTF-8 bytes, passed through as they are).
  void string(std::string_view text);
  /// A string written once and referred to by memo afterwards (repeated names), found by its content.
  void memoized_string(std::string_view text);
  /// A dict key: as memoized_string, and also found by where its bytes are, without hashing. `text` must point
  /// at storage that outlives the writer and never changes (a string literal): another string later at the same
  /// address would be taken for it.
  void key(std::string_view text);

  /// A float (BINFLOAT: the double's 8 bytes, big-endian, exact).
  void floating(double value);
  /// A bytes object (SHORT_BINBYTES or BINBYTES).
  void bytes(std::string_view data);

  void begin_dict();  ///< EMPTY_DICT MARK
  void end_dict();    ///< SETITEMS (nothing when empty)
  void begin_list();  ///< EMPTY_LIST MARK
  void end_list();    ///< APPENDS (nothing when empty)
  void tuple2();      ///< TUPLE2 of the two values written last
  void begin_tuple(); ///< MARK
  void end_tuple();   ///< TUPLE of the items since the MARK (an empty tuple too)
  void begin_set();   ///< EMPTY_SET MARK
  void end_set();     ///< ADDITEMS (nothing when empty)
  void end_frozenset();  ///< FROZENSET of the items since begin_tuple's MARK

  /// Memoizes the value written last (MEMOIZE) and returns its memo index, for `get`.
  std::uint32_t memoize();
  /// Pushes a memoized value again (BINGET or LONG_BINGET).
  void get(std::uint32_t memo_index);

  /// Reserves room for a pickle of about `bytes` bytes (one allocation instead of doublings).
  void reserve(std::size_t bytes) { out_.reserve(bytes); }

  /// Ends the pickle (STOP) and returns its bytes; the writer is empty afterwards.
  std::string finish();

 private:
  void open(char kind);
  std::uint32_t push_memoized(std::string_view text);
  void close(char kind);
  std::string out_;
  std::string open_;  // kinds of the open containers: 'd' dict, 'l' list
  std::vector<std::size_t> items_;  // items written into each open container
  std::uint32_t memo_size_ = 0;
  // Heterogeneous lookup: a key found by its string_view, no std::string built per lookup.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::uint32_t, StringHash, std::equal_to<>> strings_;
  // The last strings memoized, by where their bytes are: dict keys are string literals, found here without
  // hashing (a snapshot writes seven keys per trace entry).
  struct Recent {
    const char* data = nullptr;
    std::size_t size = 0;
    std::uint32_t memo = 0;
  };
  Recent recent_[16];
  std::size_t recent_next_ = 0;
};

struct Value;

/// Writes a value of the strict reader (pickle.hpp) as it was: every kind, containers element by element, with no
/// memo (a shared sub-value is written once per place it appears; the reader's limits bound the result). Recursive:
/// the value's depth is at most the reader's max_depth. Throws std::length_error for a string over 4 GiB.
OOMFLIGHT_API void write_value(Writer& w, const Value& value);

}  // namespace oomflight::pickle
