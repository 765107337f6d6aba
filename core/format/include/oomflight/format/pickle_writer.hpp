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
  /// A str (UTF-8 bytes, passed through as they are). Strings written through `key` are memoized by content
  /// and written once; so are those passed to `memoized_string`.
  void string(std::string_view text);
  /// A string written once and referred to by memo afterwards (dict keys and other repeated names).
  void memoized_string(std::string_view text);
  void key(std::string_view text) { memoized_string(text); }

  void begin_dict();  ///< EMPTY_DICT MARK
  void end_dict();    ///< SETITEMS (nothing when empty)
  void begin_list();  ///< EMPTY_LIST MARK
  void end_list();    ///< APPENDS (nothing when empty)
  void tuple2();      ///< TUPLE2 of the two values written last

  /// Memoizes the value written last (MEMOIZE) and returns its memo index, for `get`.
  std::uint32_t memoize();
  /// Pushes a memoized value again (BINGET or LONG_BINGET).
  void get(std::uint32_t memo_index);

  /// Ends the pickle (STOP) and returns its bytes; the writer is empty afterwards.
  std::string finish();

 private:
  void open(char kind);
  void close(char kind);
  std::string out_;
  std::string open_;  // kinds of the open containers: 'd' dict, 'l' list
  std::vector<std::size_t> items_;  // items written into each open container
  std::uint32_t memo_size_ = 0;
  std::unordered_map<std::string, std::uint32_t> strings_;
};

}  // namespace oomflight::pickle
