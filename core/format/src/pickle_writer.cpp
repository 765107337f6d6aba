// The pickle writer: opcodes as CPython's Lib/pickletools.py encodes them (little-endian arguments).
#include "oomflight/format/pickle_writer.hpp"

#include <bit>
#include <iterator>
#include <stdexcept>

#include "oomflight/format/pickle.hpp"

namespace oomflight::pickle {
namespace {
constexpr char kProto = '\x80', kStop = '.', kMark = '(', kNone = 'N', kTrue = '\x88', kFalse = '\x89';
constexpr char kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kLong1 = '\x8a';
constexpr char kShortBinUnicode = '\x8c', kBinUnicode = 'X';
constexpr char kEmptyDict = '}', kSetItems = 'u', kEmptyList = ']', kAppends = 'e', kTuple2 = '\x86';
constexpr char kMemoize = '\x94', kBinGet = 'h', kLongBinGet = 'j';
constexpr char kBinFloat = 'G', kShortBinBytes = 'C', kBinBytes = 'B', kTuple = 't', kEmptySet = '\x8f',
               kAddItems = '\x90', kFrozenSet = '\x91';

const char* fmt_close_error(char kind) {
  switch (kind) {
    case 'd': return "pickle writer: end_dict without an open dict";
    case 't': return "pickle writer: end_tuple without an open tuple";
    case 's': return "pickle writer: end_set without an open set";
    default: return "pickle writer: end_list without an open list";
  }
}

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
}  // namespace

Writer::Writer() {
  out_.push_back(kProto);
  out_.push_back('\x04');
}

void Writer::none() {
  out_.push_back(kNone);
  if (!items_.empty()) ++items_.back();
}

void Writer::boolean(bool value) {
  out_.push_back(value ? kTrue : kFalse);
  if (!items_.empty()) ++items_.back();
}

void Writer::integer(std::int64_t v) {
  if (v >= 0 && v < 256) {
    out_.push_back(kBinInt1);
    put_le(out_, static_cast<std::uint64_t>(v), 1);
  } else if (v >= 0 && v < 65536) {
    out_.push_back(kBinInt2);
    put_le(out_, static_cast<std::uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_.push_back(kBinInt);
    put_le(out_, static_cast<std::uint64_t>(static_cast<std::uint32_t>(static_cast<std::int32_t>(v))), 4);
  } else {
    // LONG1: the fewest little-endian two's-complement bytes that keep the sign.
    std::uint8_t bytes[8];
    int n = 0;
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::uint8_t>((u >> (8 * i)) & 0xff);
    n = 8;
    while (n > 1) {
      const bool top_redundant = v < 0 ? bytes[n - 1] == 0xff && (bytes[n - 2] & 0x80) : bytes[n - 1] == 0 && !(bytes[n - 2] & 0x80);
      if (!top_redundant) break;
      --n;
    }
    out_.push_back(kLong1);
    out_.push_back(static_cast<char>(n));
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>(bytes[i]));
  }
  if (!items_.empty()) ++items_.back();
}

void Writer::unsigned_integer(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(v));
  // Above 2^63: nine bytes, the ninth a zero sign byte.
  out_.push_back(kLong1);
  out_.push_back('\x09');
  put_le(out_, v, 8);
  out_.push_back('\0');
  if (!items_.empty()) ++items_.back();
}

void Writer::string(std::string_view text) {
  if (text.size() < 256) {
    out_.push_back(kShortBinUnicode);
    put_le(out_, text.size(), 1);
  } else {
    if (text.size() > UINT32_MAX) throw std::length_error("pickle writer: a string longer than 4 GiB");
    out_.push_back(kBinUnicode);
    put_le(out_, text.size(), 4);
  }
  out_.append(text);
  if (!items_.empty()) ++items_.back();
}

void Writer::memoized_string(std::string_view text) { push_memoized(text); }

void Writer::floating(double value) {
  out_.push_back(kBinFloat);
  const auto bits = std::bit_cast<std::uint64_t>(value);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  if (!items_.empty()) ++items_.back();
}

void Writer::bytes(std::string_view data) {
  if (data.size() < 256) {
    out_.push_back(kShortBinBytes);
    put_le(out_, data.size(), 1);
  } else {
    if (data.size() > UINT32_MAX) throw std::length_error("pickle writer: a bytes object longer than 4 GiB");
    out_.push_back(kBinBytes);
    put_le(out_, data.size(), 4);
  }
  out_.append(data);
  if (!items_.empty()) ++items_.back();
}

void Writer::key(std::string_view text) {
  for (const Recent& r : recent_) {
    if (r.data == text.data() && r.size == text.size()) return get(r.memo);
  }
  recent_[recent_next_++ % std::size(recent_)] = Recent{text.data(), text.size(), push_memoized(text)};
}

std::uint32_t Writer::push_memoized(std::string_view text) {
  if (auto it = strings_.find(text); it != strings_.end()) {
    get(it->second);
    return it->second;
  }
  string(text);
  const std::uint32_t memo = memoize();
  strings_.emplace(std::string(text), memo);
  return memo;
}

void Writer::open(char kind) {
  if (!items_.empty()) ++items_.back();  // the container is an item of its parent
  if (kind != 't') out_.push_back(kind == 'd' ? kEmptyDict : kind == 's' ? kEmptySet : kEmptyList);
  out_.push_back(kMark);
  open_.push_back(kind);
  items_.push_back(0);
}

void Writer::close(char kind) {
  if (open_.empty() || open_.back() != kind) {
    throw std::logic_error(fmt_close_error(kind));
  }
  const std::size_t n = items_.back();
  if (kind == 'd' && n % 2 != 0) throw std::logic_error("pickle writer: a dict closed with a key and no value");
  if (kind == 't') {
    out_.push_back(kTuple);  // MARK ... TUPLE, an empty tuple included
  } else if (n == 0) {
    out_.pop_back();  // the MARK: an empty container needs none
  } else {
    out_.push_back(kind == 'd' ? kSetItems : kind == 's' ? kAddItems : kAppends);
  }
  open_.pop_back();
  items_.pop_back();
}

void Writer::begin_tuple() { open('t'); }
void Writer::end_tuple() { close('t'); }
void Writer::begin_set() { open('s'); }
void Writer::end_frozenset() {
  if (open_.empty() || open_.back() != 't') throw std::logic_error("pickle writer: end_frozenset without a MARK");
  open_.pop_back();
  items_.pop_back();
  out_.push_back(kFrozenSet);
}
void Writer::end_set() { close('s'); }
void Writer::begin_dict() { open('d'); }
void Writer::end_dict() { close('d'); }
void Writer::begin_list() { open('l'); }
void Writer::end_list() { close('l'); }

void Writer::tuple2() {
  if (items_.empty() || items_.back() < 2) throw std::logic_error("pickle writer: tuple2 needs two values");
  out_.push_back(kTuple2);
  --items_.back();  // two items became one
}

std::uint32_t Writer::memoize() {
  out_.push_back(kMemoize);
  return memo_size_++;
}

void Writer::get(std::uint32_t index) {
  if (index >= memo_size_) throw std::logic_error("pickle writer: get of a memo index not written");
  if (index < 256) {
    out_.push_back(kBinGet);
    put_le(out_, index, 1);
  } else {
    out_.push_back(kLongBinGet);
    put_le(out_, index, 4);
  }
  if (!items_.empty()) ++items_.back();
}

std::string Writer::finish() {
  if (!open_.empty()) throw std::logic_error("pickle writer: finish with a container still open");
  out_.push_back(kStop);
  std::string bytes = std::move(out_);
  out_.clear();
  strings_.clear();
  for (Recent& r : recent_) r = Recent{};
  memo_size_ = 0;
  return bytes;
}

void write_value(Writer& w, const Value& v) {
  switch (v.kind) {
    case Kind::none: return w.none();
    case Kind::boolean: return w.boolean(v.boolean);
    case Kind::integer:
      return v.above_int64 ? w.unsigned_integer(static_cast<std::uint64_t>(v.integer)) : w.integer(v.integer);
    case Kind::floating: return w.floating(v.floating);
    case Kind::string: return w.string(v.text);
    case Kind::bytes: return w.bytes(v.text);
    case Kind::list:
      w.begin_list();
      for (const Value* item : v.items) write_value(w, *item);
      return w.end_list();
    case Kind::tuple:
      w.begin_tuple();
      for (const Value* item : v.items) write_value(w, *item);
      return w.end_tuple();
    case Kind::set:
      w.begin_set();
      for (const Value* item : v.items) write_value(w, *item);
      return w.end_set();
    case Kind::frozenset:
      w.begin_tuple();  // MARK items FROZENSET
      for (const Value* item : v.items) write_value(w, *item);
      return w.end_frozenset();
    case Kind::dict:
      w.begin_dict();
      for (const Value* item : v.items) write_value(w, *item);
      return w.end_dict();
  }
}

}  // namespace oomflight::pickle
