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

enum class Kind : std::uint8_t { none, boolean, integer, floating, string, bytes, list, tuple, dict, set, frozenset };

struct Value;

/// A container's elements: a run of pointers in its Document's element arena (one arena for all containers:
/// a vector per container was a fifth of a snapshot's parse in malloc and free). Read-only to its users.
class Items {
 public:
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Value* const* data() const { return data_; }
  Value* operator[](std::size_t i) const { return data_[i]; }
  Value* const* begin() const { return data_; }
  Value* const* end() const { return data_ + size_; }

 private:
  friend class Parser;
  Value** data_ = nullptr;
  std::uint32_t size_ = 0;
  std::uint32_t capacity_ = 0;
};

/// A value. Strings and bytes are views into the Document's buffer. Containers hold pointers into the
/// Document's arena; a dict's items are key, value, key, value, ... Values are owned by their Document.
struct OOMFLIGHT_API Value {
  Kind kind = Kind::none;
  std::uint16_t depth = 0;  ///< nesting depth: 0 for scalars and empty containers, exact for every value
  bool boolean = false;
  bool placed = false;  ///< true once the value is an element of some container
  std::int64_t integer = 0;
  /// The integer is in 2^63 .. 2^64 - 1 (Python wrote it as a 9-byte LONG1): `integer` holds its low 64 bits, so
  /// static_cast<std::uint64_t>(integer) is the value. Wider integers are refused.
  bool above_int64 = false;
  double floating = 0;
  std::string_view text;  ///< string (UTF-8) or bytes
  Items items;

  bool is(Kind k) const { return kind == k; }
  /// dict: the value of a string key, or nullptr.
  const Value* get(std::string_view key) const;
  /// Number of elements (list, tuple, set) or entries (dict).
  std::size_t size() const { return kind == Kind::dict ? items.size() / 2 : items.size(); }
};

/// The reader's limits. Defaults fit PyTorch snapshots with a wide margin: a 3.2 MB snapshot of a transformer's
/// full step holds 0.13 M values and takes 21 MB decoded (6.5 x the file); a 1 M-entry trace about 10 M
/// values. Each limit is checked before the memory it guards is taken, and its error names it.
struct Limits {
  std::size_t max_depth = 1000;  ///< deeper nesting is refused (PyTorch snapshots nest 7 levels); at most 65535
  std::size_t max_values = 128u << 20;  ///< values created (scalars and containers); a memo reference is not one
  std::size_t max_memory_bytes = std::size_t{8} << 30;  ///< the input plus the decoded values, element lists,
                                                        ///< memo and stack, in bytes
};

/// A parsed pickle: owns its bytes and its values. Movable, not copyable. Read-only after parse: thread-safe to
/// read from several threads.
class OOMFLIGHT_API Document {
 public:
  /// Parses `bytes`. Throws PickleError for: an opcode that loads code (named), an unknown opcode, a truncated
  /// file, a length that runs past the end, an integer outside int64 and uint64, a memo index out of range, nesting
  /// deeper than limits.max_depth, more values than limits.max_values or more memory than
  /// limits.max_memory_bytes (the error names the limit), a container added to itself or to one of its
  /// ancestors (a cycle: `l = []; l.append(l)`), a container that grows deeper after it was placed in another
  /// one (no pickler writes that; refusing it keeps every depth exact, which is what makes the cycle check
  /// O(1)), a stack or mark underflow, a torch.save zip, a gzip file or a protocol 0/1 pickle (each named), or
  /// no STOP. Never executes anything; never recurses (so nesting cannot overflow the C stack). The values form
  /// a directed acyclic graph: the memo may share one value between containers, so a walker that counts
  /// elements must bound its own output (decode_torch_snapshot does, by value_count()).
  static Document parse(std::string bytes, const Limits& limits = {});

  /// The pickled object (the snapshot dict for a PyTorch snapshot). Valid as long as the Document lives.
  const Value& root() const { return *root_; }

  /// Number of values the pickle created. A tree walk of the root visits more only when the memo shares values.
  std::size_t value_count() const { return arena_.size(); }

  /// The memory the parse charged against Limits::max_memory_bytes (input, values, element lists, memo, stack).
  std::size_t memory_bytes() const { return memory_bytes_; }

  Document(Document&&) noexcept = default;
  Document& operator=(Document&&) noexcept = default;

 private:
  Document() = default;
  friend class Parser;
  std::unique_ptr<std::string> bytes_;  // on the heap: Values view it, and a Document moves
  std::deque<Value> arena_;  // stable addresses; destroyed without recursion
  std::vector<std::unique_ptr<Value*[]>> item_chunks_;  // the element arena (Items point into it)
  Value* root_ = nullptr;
  std::size_t memory_bytes_ = 0;
};

/// Reads a whole file and parses it. Throws std::runtime_error naming the file when it cannot be read, and
/// PickleError (its message prefixed with the file name) when it is not a pickle this reader accepts.
OOMFLIGHT_API Document read_pickle_file(const std::string& path, const Limits& limits = {});

}  // namespace oomflight::pickle
