// A strict reader for Python pickles that hold only data (protocols 2 to 5), written for PyTorch memory
// snapshots. It never loads or calls code: every opcode that would (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST,
// OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID, ...) is refused with an error naming the opcode and its
// offset. Opcode semantics follow CPython's Lib/pickletools.py.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "oomflight/api.h"

namespace oomflight::pickle {

/// Thrown for anything the reader refuses; `offset` is the byte offset of the opcode at fault.
struct PickleError : std::runtime_error {
  PickleError(const std::string& what, std::uint64_t at) : std::runtime_error(what), offset(at) {}
  std::uint64_t offset;
};

enum class Kind : std::uint8_t { none, boolean, integer, floating, string, bytes, list, tuple, dict, set };

/// A value. Strings and bytes are views into the Document's buffer. Containers hold pointers into the
/// Document's arena; a dict's items are key, value, key, value, ... Values are owned by their Document.
struct OOMFLIGHT_API Value {
  Kind kind = Kind::none;
  std::uint16_t depth = 0;  ///< nesting depth (0 for scalars)
  bool boolean = false;
  std::int64_t integer = 0;
  double floating = 0;
  std::string_view text;  ///< string (UTF-8) or bytes
  std::vector<Value*> items;

  bool is(Kind k) const { return kind == k; }
  /// dict: the value of a string key, or nullptr.
  const Value* get(std::string_view key) const;
  /// Number of elements (list, tuple, set) or entries (dict).
  std::size_t size() const { return kind == Kind::dict ? items.size() / 2 : items.size(); }
};

/// The reader's limits. Defaults fit PyTorch snapshots with a wide margin.
struct Limits {
  std::size_t max_depth = 1000;  ///< deeper nesting is refused (PyTorch snapshots nest 7 levels)
};

/// A parsed pickle: owns its bytes and its values. Movable, not copyable. Read-only after parse: thread-safe to
/// read from several threads.
class OOMFLIGHT_API Document {
 public:
  /// Parses `bytes`. Throws PickleError for: an opcode that loads code (named), an unknown opcode, a truncated
  /// file, a length that runs past the end, an integer wider than 64 bits, a memo index out of range, nesting
  /// deeper than limits.max_depth, a stack or mark underflow, or no STOP. Never executes anything; never
  /// recurses (so nesting cannot overflow the C stack).
  static Document parse(std::string bytes, const Limits& limits = {});

  /// The pickled object (the snapshot dict for a PyTorch snapshot). Valid as long as the Document lives.
  const Value& root() const { return *root_; }

  Document(Document&&) noexcept = default;
  Document& operator=(Document&&) noexcept = default;

 private:
  Document() = default;
  friend class Parser;
  std::unique_ptr<std::string> bytes_;  // on the heap: Values view it, and a Document moves
  std::deque<Value> arena_;  // stable addresses; destroyed without recursion
  Value* root_ = nullptr;
};

/// Reads a whole file and parses it. Throws std::runtime_error naming the file when it cannot be read, and
/// PickleError (its message prefixed with the file name) when it is not a pickle this reader accepts.
OOMFLIGHT_API Document read_pickle_file(const std::string& path, const Limits& limits = {});

}  // namespace oomflight::pickle
