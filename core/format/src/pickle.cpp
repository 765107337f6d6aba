// The strict pickle reader: a stack machine over the data opcodes only.
#include "oomflight/format/pickle.hpp"

#include <array>
#include <bit>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <span>
#include <sstream>
#include <unordered_set>

namespace oomflight::pickle {

const Value* Value::get(std::string_view key) const {
  if (kind != Kind::dict) return nullptr;
  for (std::size_t i = 0; i + 1 < items.size(); i += 2) {
    if (items[i]->kind == Kind::string && items[i]->text == key) return items[i + 1];
  }
  return nullptr;
}

namespace {

struct OpName {
  std::uint8_t code;
  const char* name;
};

// Opcodes that import, call or build objects: never accepted.
constexpr std::array<OpName, 15> kCodeOpcodes = {{{'c', "GLOBAL"},
                                                  {0x93, "STACK_GLOBAL"},
                                                  {'R', "REDUCE"},
                                                  {'b', "BUILD"},
                                                  {'i', "INST"},
                                                  {'o', "OBJ"},
                                                  {0x81, "NEWOBJ"},
                                                  {0x92, "NEWOBJ_EX"},
                                                  {0x82, "EXT1"},
                                                  {0x83, "EXT2"},
                                                  {0x84, "EXT4"},
                                                  {'P', "PERSID"},
                                                  {'Q', "BINPERSID"},
                                                  {0x97, "NEXT_BUFFER"},
                                                  {0x98, "READONLY_BUFFER"}}};

const char* code_opcode_name(std::uint8_t op) {
  for (const auto& o : kCodeOpcodes) {
    if (o.code == op) return o.name;
  }
  return nullptr;
}

}  // namespace

class Parser {
 public:
  Parser(Document& doc, const Limits& limits)
      : doc_(doc), limits_(limits), max_depth_(std::min<std::size_t>(limits.max_depth, 65535)),
        data_(*doc.bytes_) {
    account(data_.size());
  }

  // What the file is when it is not a pickle we read, by its first bytes: the most common wrong inputs get a
  // message that says what they are and what to do, not "unsupported opcode".
  void check_format() const {
    const auto starts = [&](std::string_view magic) { return data_.substr(0, magic.size()) == magic; };
    if (starts("PK\x03\x04")) {
      fail("a zip archive (torch.save's format), not a pickle: write the snapshot with "
           "torch.cuda.memory._dump_snapshot(path) or pickle.dump(torch.cuda.memory._snapshot(), f)");
    }
    if (starts("\x1f\x8b")) fail("a gzip file, not a pickle: decompress it first (gunzip)");
    if (!data_.empty() && static_cast<std::uint8_t>(data_[0]) != 0x80) {
      fail("a protocol 0 or 1 pickle (it does not start with PROTO); oomflight reads protocols 2 to 5, as "
           "torch.cuda.memory._dump_snapshot writes them: re-save it with pickle.dump(obj, f, protocol=4)");
    }
  }

  void run() {
    check_format();
    for (;;) {
      if (pos_ >= data_.size()) fail("the pickle ends without STOP (truncated file?)");
      op_at_ = pos_;
      const auto op = static_cast<std::uint8_t>(data_[pos_++]);
      if (op == '.') {  // STOP
        if (stack_.size() != 1) fail(fmt::format("STOP with {} values on the stack (expected 1)", stack_.size()));
        doc_.root_ = stack_.back();
        doc_.memory_bytes_ = memory_;
        return;
      }
      step(op);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw PickleError(fmt::format("{} at offset {}", what, op_at_), op_at_);
  }

  std::string_view take(std::uint64_t n) {
    if (n > data_.size() - pos_) {
      fail(fmt::format("a length of {} bytes runs past the end of the data ({} left; truncated file?)", n,
                       data_.size() - pos_));
    }
    std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  std::uint64_t read_le(int n) {
    const auto b = take(static_cast<std::uint64_t>(n));
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(b[static_cast<std::size_t>(i)]);
    return v;
  }

  // Charges `n` bytes against Limits::max_memory_bytes before they are taken.
  void account(std::size_t n) {
    memory_ += n;
    if (memory_ > limits_.max_memory_bytes) {
      fail(fmt::format("decoding this pickle needs more than {} bytes of memory (Limits::max_memory_bytes); a "
                       "PyTorch snapshot needs about 7 times its file size",
                       limits_.max_memory_bytes));
    }
  }

  // Charges the growth of a vector's buffer, before the push that would grow it.
  template <typename T>
  void grow(const std::vector<T>& v) {
    if (v.size() == v.capacity()) account(sizeof(T) * std::max<std::size_t>(v.capacity(), 1));
  }

  Value* make(Kind kind) {
    if (doc_.arena_.size() >= limits_.max_values) {
      fail(fmt::format("the pickle holds more than {} values (Limits::max_values)", limits_.max_values));
    }
    account(sizeof(Value));
    Value& v = doc_.arena_.emplace_back();
    v.kind = kind;
    return &v;
  }

  void push(Value* v) {
    grow(stack_);
    stack_.push_back(v);
  }

  Value* pop() {
    if (stack_.size() <= floor()) fail("stack underflow");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }

  Value* top() {
    if (stack_.size() <= floor()) fail("stack underflow");
    return stack_.back();
  }

  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }

  // Pops everything above the newest MARK, and the mark. The values land in a buffer reused by every call (valid
  // until the next one): a fresh vector per container was a tenth of the parse in malloc and free.
  std::span<Value* const> pop_mark() {
    if (marks_.empty()) fail("no MARK on the stack");
    const std::size_t at = marks_.back();
    marks_.pop_back();
    popped_.assign(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
    stack_.resize(at);
    return popped_;
  }

  // Makes room for `extra` more elements in one step (charged first). A run at the end of the current chunk grows
  // in place; any other moves to the chunk's end (the old run is left unused: containers that grow after others
  // were made are rare in pickles, where a container's items follow it).
  void reserve_items(Value* v, std::size_t extra) {
    Items& it = v->items;
    const std::size_t want = static_cast<std::size_t>(it.size_) + extra;
    if (want <= it.capacity_) return;
    if (want > UINT32_MAX) fail("a container of more than 2^32 elements");
    const std::size_t more = want - it.capacity_;
    if (it.data_ != nullptr && it.data_ + it.capacity_ == chunk_ + chunk_used_ && chunk_used_ + more <= chunk_size_) {
      account(sizeof(Value*) * more);
      chunk_used_ += more;
      it.capacity_ = static_cast<std::uint32_t>(want);
      return;
    }
    // A run of twice what is needed when the container already had one (APPENDS in batches of 1000).
    const std::size_t run = it.capacity_ == 0 ? want : std::max(want, 2 * static_cast<std::size_t>(it.capacity_));
    if (chunk_size_ - chunk_used_ < run) {
      const std::size_t size = std::max(kChunkItems, run);
      account(sizeof(Value*) * size);
      doc_.item_chunks_.push_back(std::make_unique<Value*[]>(size));
      chunk_ = doc_.item_chunks_.back().get();
      chunk_size_ = size;
      chunk_used_ = 0;
    }
    Value** data = chunk_ + chunk_used_;
    chunk_used_ += run;
    if (it.size_ != 0) std::memcpy(data, it.data_, sizeof(Value*) * it.size_);
    it.data_ = data;
    it.capacity_ = static_cast<std::uint32_t>(run);
  }

  // Places `child` in `parent`. Invariant: every value's depth is exact. It holds because a container only
  // grows deeper while it is in no container (its depth has no one to propagate to); a placed container that
  // would grow deeper is refused. That makes the cycle check O(1): if `child` reaches `parent`, then child is
  // deeper than parent, so parent would grow deeper; parent must then be placed (else nothing reaches it), and
  // the refusal catches it. Only on that error path do we walk the graph, to say which of the two it was.
  [[gnu::always_inline]] inline void adopt(Value* parent, Value* child) {
    if (child == parent) fail("a container added to itself (a cycle: l = []; l.append(l))");
    const auto d = static_cast<std::size_t>(child->depth) + 1;
    if (d > max_depth_) fail(fmt::format("nesting deeper than {} levels", max_depth_));
    if (d > parent->depth) {
      if (parent->placed) {
        if (reaches(child, parent)) fail("a container added to one of its own ancestors (a cycle)");
        fail("a container that grows deeper after it was placed in another container (no pickler writes this)");
      }
      parent->depth = static_cast<std::uint16_t>(d);
    }
    parent->items.data_[parent->items.size_++] = child;  // room made by the caller (reserve_items)
    child->placed = true;
  }

  // Whether `target` is reachable from `from` (error path only; bounded by the values already made).
  static bool reaches(const Value* from, const Value* target) {
    std::unordered_set<const Value*> seen{from};
    std::vector<const Value*> todo{from};
    while (!todo.empty()) {
      const Value* v = todo.back();
      todo.pop_back();
      for (const Value* c : v->items) {
        if (c == target) return true;
        if (seen.insert(c).second) todo.push_back(c);
      }
    }
    return false;
  }

  Value* container(Kind kind, std::span<Value* const> children) {
    Value* v = make(kind);
    if (kind == Kind::dict && children.size() % 2 != 0) fail("odd number of items for a dict");
    reserve_items(v, children.size());
    for (Value* c : children) adopt(v, c);
    return v;
  }

  void extend(Value* target, std::span<Value* const> children, Kind expected, const char* op) {
    if (target->kind != expected && !(expected == Kind::list && target->kind == Kind::set)) {
      fail(fmt::format("{} on a value that is not a {}", op, expected == Kind::dict ? "dict" : "list"));
    }
    if (expected == Kind::dict && children.size() % 2 != 0) fail(fmt::format("{} with an odd number of items", op));
    reserve_items(target, children.size());
    for (Value* c : children) adopt(target, c);
  }

  Value* integer(std::int64_t v) {
    Value* x = make(Kind::integer);
    x->integer = v;
    return x;
  }

  // LONG1/LONG4: little-endian two's complement of n bytes.
  Value* long_integer(std::uint64_t n) {
    const auto b = take(n);
    if (n == 0) return integer(0);
    const bool negative = (static_cast<std::uint8_t>(b[n - 1]) & 0x80) != 0;
    // Bytes past the eighth may only repeat the sign; the value must fit in int64.
    for (std::uint64_t i = 8; i < n; ++i) {
      if (static_cast<std::uint8_t>(b[i]) != (negative ? 0xff : 0x00)) fail("an integer wider than 64 bits");
    }
    std::uint64_t v = negative ? ~std::uint64_t{0} : 0;
    const std::uint64_t used = n < 8 ? n : 8;
    for (std::uint64_t i = 0; i < used; ++i) {
      v &= ~(std::uint64_t{0xff} << (8 * i));
      v |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(b[i])) << (8 * i);
    }
    if (n >= 8 && ((v >> 63) != 0) != negative) {
      // 2^63 .. 2^64 - 1 (a device address or a byte count as uint64): kept, flagged, for unsigned readers.
      if (!negative && n > 8) {
        Value* x = integer(static_cast<std::int64_t>(v));
        x->above_int64 = true;
        return x;
      }
      fail("an integer wider than 64 bits");
    }
    return integer(static_cast<std::int64_t>(v));
  }

  Value* text(Kind kind, std::uint64_t n) {
    Value* v = make(kind);
    v->text = take(n);
    return v;
  }

  void memo_put(std::uint64_t index) {
    // A memo index can never exceed the number of opcodes, so bound it by the file size.
    if (index > data_.size()) fail(fmt::format("memo index {} is out of range", index));
    if (index >= memo_.size()) {
      account(sizeof(Value*) * (index + 1 - memo_.size()));
      memo_.resize(index + 1, nullptr);
    }
    memo_[index] = top();
  }

  void memo_get(std::uint64_t index) {
    if (index >= memo_.size() || memo_[index] == nullptr) fail(fmt::format("memo index {} was never stored", index));
    push(memo_[index]);
  }

  void step(std::uint8_t op) {
    switch (op) {
      case 0x80: {  // PROTO
        const auto proto = read_le(1);
        if (proto < 2 || proto > 5) fail(fmt::format("pickle protocol {} (this reader accepts 2 to 5)", proto));
        break;
      }
      case 0x95: read_le(8); break;  // FRAME: a hint for buffered readers; we hold the whole file
      case '(': grow(marks_); marks_.push_back(stack_.size()); break;           // MARK
      case '0': pop(); break;                                                   // POP
      case '1': pop_mark(); break;                                              // POP_MARK
      case '2': push(top()); break;                                             // DUP
      case 'N': push(make(Kind::none)); break;                                  // NONE
      case 0x88: case 0x89: {                                                   // NEWTRUE, NEWFALSE
        Value* v = make(Kind::boolean);
        v->boolean = op == 0x88;
        push(v);
        break;
      }
      case 'J': push(integer(static_cast<std::int32_t>(read_le(4)))); break;   // BININT
      case 'K': push(integer(static_cast<std::int64_t>(read_le(1)))); break;   // BININT1
      case 'M': push(integer(static_cast<std::int64_t>(read_le(2)))); break;   // BININT2
      case 0x8a: push(long_integer(read_le(1))); break;                        // LONG1
      case 0x8b: push(long_integer(read_le(4))); break;                        // LONG4
      case 'G': {                                                              // BINFLOAT: big-endian
        const auto b = take(8);
        std::uint64_t bits = 0;
        for (char c : b) bits = (bits << 8) | static_cast<std::uint8_t>(c);
        Value* v = make(Kind::floating);
        v->floating = std::bit_cast<double>(bits);
        push(v);
        break;
      }
      case 'X': push(text(Kind::string, read_le(4))); break;                   // BINUNICODE
      case 0x8c: push(text(Kind::string, read_le(1))); break;                  // SHORT_BINUNICODE
      case 0x8d: push(text(Kind::string, read_le(8))); break;                  // BINUNICODE8
      case 'T': push(text(Kind::bytes, read_le(4))); break;                    // BINSTRING
      case 'U': push(text(Kind::bytes, read_le(1))); break;                    // SHORT_BINSTRING
      case 'B': push(text(Kind::bytes, read_le(4))); break;                    // BINBYTES
      case 'C': push(text(Kind::bytes, read_le(1))); break;                    // SHORT_BINBYTES
      case 0x8e: case 0x96: push(text(Kind::bytes, read_le(8))); break;        // BINBYTES8, BYTEARRAY8
      case ')': push(make(Kind::tuple)); break;                                // EMPTY_TUPLE
      case ']': push(make(Kind::list)); break;                                 // EMPTY_LIST
      case '}': push(make(Kind::dict)); break;                                 // EMPTY_DICT
      case 0x8f: push(make(Kind::set)); break;                                 // EMPTY_SET
      case 't': push(container(Kind::tuple, pop_mark())); break;               // TUPLE
      case 'l': push(container(Kind::list, pop_mark())); break;                // LIST
      case 'd': push(container(Kind::dict, pop_mark())); break;                // DICT
      case 0x91: push(container(Kind::frozenset, pop_mark())); break;          // FROZENSET
      case 0x85: case 0x86: case 0x87: {                                       // TUPLE1, TUPLE2, TUPLE3
        const std::size_t n = op - 0x84u;
        std::array<Value*, 3> items{};
        for (std::size_t i = n; i-- > 0;) items[i] = pop();
        push(container(Kind::tuple, std::span<Value* const>(items.data(), n)));
        break;
      }
      case 'a': {                                                              // APPEND
        Value* const item[] = {pop()};
        extend(top(), item, Kind::list, "APPEND");
        break;
      }
      case 'e': case 0x90: {                                                   // APPENDS, ADDITEMS
        auto items = pop_mark();
        extend(top(), items, Kind::list, op == 'e' ? "APPENDS" : "ADDITEMS");
        break;
      }
      case 's': {                                                              // SETITEM
        Value* value = pop();
        Value* key = pop();
        Value* const pair[] = {key, value};
        extend(top(), pair, Kind::dict, "SETITEM");
        break;
      }
      case 'u': {                                                              // SETITEMS
        auto items = pop_mark();
        extend(top(), items, Kind::dict, "SETITEMS");
        break;
      }
      case 'q': memo_put(read_le(1)); break;                                   // BINPUT
      case 'r': memo_put(read_le(4)); break;                                   // LONG_BINPUT
      case 0x94: memo_put(memo_count_++); break;                               // MEMOIZE
      case 'h': memo_get(read_le(1)); break;                                   // BINGET
      case 'j': memo_get(read_le(4)); break;                                   // LONG_BINGET
      default: {
        if (const char* name = code_opcode_name(op)) {
          fail(fmt::format("opcode {} (0x{:02x}) would load or call code; oomflight reads data-only pickles", name,
                           op));
        }
        fail(fmt::format("unsupported pickle opcode 0x{:02x}", op));
      }
    }
    if (op == 'q' || op == 'r') memo_count_ = std::max<std::uint64_t>(memo_count_, memo_.size());
  }

  Document& doc_;
  const Limits& limits_;
  std::size_t max_depth_;
  std::size_t memory_ = 0;
  std::string_view data_;
  std::size_t pos_ = 0;
  std::size_t op_at_ = 0;
  std::vector<Value*> stack_;
  std::vector<Value*> popped_;  // pop_mark()'s buffer
  std::vector<std::size_t> marks_;
  std::vector<Value*> memo_;
  std::uint64_t memo_count_ = 0;
  static constexpr std::size_t kChunkItems = 64 * 1024;  // elements per arena chunk (512 KiB)
  Value** chunk_ = nullptr;  // the element arena's current chunk
  std::size_t chunk_size_ = 0;
  std::size_t chunk_used_ = 0;
};

Document Document::parse(std::string bytes, const Limits& limits) {
  Document doc;
  doc.bytes_ = std::make_unique<std::string>(std::move(bytes));
  Parser(doc, limits).run();
  return doc;
}

Document read_pickle_file(const std::string& path, const Limits& limits) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open ({})", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw std::runtime_error(fmt::format("{}: read error", path));
  try {
    return Document::parse(std::move(ss).str(), limits);
  } catch (const PickleError& e) {
    throw PickleError(fmt::format("{}: {}", path, e.what()), e.offset);
  }
}

}  // namespace oomflight::pickle
