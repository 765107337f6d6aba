// oomflight's own capture of the allocating thread's Python stack (issue 32): what torch's context recording
// (CapturedTraceback::gather, 1,378 ns for 20 frames in bench/torch_tracker_bench.py) gives, at a fraction of its
// cost, so that call sites can be on by default.
//
// How the field's tools do it, and what this takes from each: memray keeps a shadow stack per thread through a
// profile hook, so an allocation only names the current node, but the hook costs every Python call, allocating or
// not; py-spy and austin read the interpreter's frames from outside, through layouts they guess per version; torch
// walks the public frame API (PyFrame_GetBack, PyFrame_GetCode), which materialises a frame object per frame and
// takes a reference on each code object. Here the allocating thread reads its own frames in place, through the
// interpreter's own headers (this file is compiled against the Python it runs in, so no layout is guessed): for
// Python 3.11, the one these machines test (Debian 12), `_PyInterpreterFrame` (pycore_frame.h: f_code, prev_instr,
// previous; incomplete frames skipped as CPython's own traceback does); for any other Python, the public frame API
// (slower; correct). Each stack is kept as (code object, instruction offset) pairs, interned: a training step
// allocates from the same few hundred stacks again and again, so the hot path is a walk, a hash and a lookup.
// Names, files and lines are resolved at the freeze, with the GIL (resolve()), once per stack.
//
// Threads: a thread that holds the GIL walks and interns; a thread that does not (autograd's backward threads,
// NCCL's, a Python thread inside an operator that released the GIL) cannot take references on code objects, so it
// only looks its stack up (a stack seen before keeps its frames) and otherwise is named: "thread 'pt_autograd_0'
// (no Python frame)" rather than no stack at all. A spin lock guards the table (GIL holders are serialised
// anyway; the others are not).
//
// Memory: at most max_stacks stacks and max_frames frames (16 bytes each), set from the history's size; a stack
// past either bound is not kept and is counted (dropped()). The code objects of kept stacks are referenced until
// the process ends.
#pragma once

#include <Python.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(Py_GIL_DISABLED)
#define OOMFLIGHT_FRAMES_IN_PLACE 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#else
#define OOMFLIGHT_FRAMES_IN_PLACE 0
#endif

#include <pthread.h>

#include "python_thread.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <algorithm>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace oomflight::torch_plugin {

class PythonStacks {
 public:
  /// Deferred ids of this table's stacks: kFirstId, kFirstId - 1, ... (ContextTable's ids stay above kFirstId).
  static constexpr std::int32_t kFirstId = -(1 << 30) - 1;
  static constexpr std::size_t kMaxDepth = 128;  ///< frames kept per stack, innermost first (deeper: the outer cut)

  /// How the frames are read in this build: "in place" (the interpreter's frames) or "public frame API".
  static const char* method() noexcept { return OOMFLIGHT_FRAMES_IN_PLACE ? "in place" : "public frame API"; }

  /// At most `max_stacks` stacks of `max_frames` frames in all. Reserves (untouched: address space, not memory)
  /// 16 bytes a frame and about 100 bytes a stack up front, so that kept frames never move; throws std::bad_alloc.
  PythonStacks(std::size_t max_stacks, std::size_t max_frames)
      : max_stacks_(max_stacks), max_frames_(max_frames), slots_(slot_count(max_stacks), kNoStack) {
    stacks_.reserve(max_stacks);
    frames_.reserve(max_frames);
  }

  static bool owns(std::int32_t deferred) noexcept { return deferred <= kFirstId; }

  /// The hot path (the allocator's mutex held, on the allocating thread): this thread's Python stack as a
  /// deferred id, or -1 when it cannot be kept (counted). Never throws; allocates only for a stack seen for the
  /// first time.
  std::int32_t capture() noexcept {
    try {
      if (!Py_IsInitialized()) return -1;
      Walk w;  // 2 KiB of this thread's stack: a thread_local here is a __tls_get_addr call (a dlopen'ed module)
      // Not PyGILState_Check(): it answers yes on every thread once a sub-interpreter exists (python_thread.hpp).
      const bool gil = holds_gil();
      if (!walk(w, gil)) return named_thread();
      Guard lock(busy_);
      if (const std::int32_t found = find(w); found != -1) return found;
      if (!gil) return named_thread_locked();  // no reference can be taken on its code objects
      return add(w);
    } catch (...) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return -1;
    }
  }

  /// One resolved frame: function (qualified name), file, line (1-based; 0 unknown).
  using Frame = std::tuple<std::string, std::string, int>;

  /// The frames of stack `deferred` (owns() true), innermost first; resolved once, with the GIL held by the
  /// caller. Empty for an unknown id.
  std::vector<Frame> resolve(std::int32_t deferred) {
    const auto index = static_cast<std::size_t>(static_cast<std::int64_t>(kFirstId) - deferred);
    std::vector<RawFrame> raw;
    std::string thread_name;
    {
      Guard lock(busy_);
      if (index >= stacks_.size()) return {};
      const Stack& s = stacks_[index];
      if (s.resolved) return s.frames;
      thread_name = s.thread_name;
      raw.assign(frames_.begin() + static_cast<std::ptrdiff_t>(s.offset),
                 frames_.begin() + static_cast<std::ptrdiff_t>(s.offset + s.count));
    }
    // Resolved without the spin lock: reading a line table calls into Python, which may collect garbage there and
    // then run a finaliser that frees or allocates a tensor, whose trace callback captures a stack: on this thread,
    // under the lock, that capture would spin for ever.
    std::vector<Frame> frames;
    if (!thread_name.empty()) {
      frames.emplace_back("thread '" + thread_name + "' (no Python frame)", "", 0);
    } else {
      for (const RawFrame& f : raw) frames.push_back(resolve_frame(f));
    }
    Guard lock(busy_);
    Stack& s = stacks_[index];
    if (!s.resolved) {
      s.frames = std::move(frames);
      s.resolved = true;
    }
    return s.frames;
  }

  /// The interned liboomflight stack id of `deferred`, remembered after a first resolution (-1 when none yet).
  std::int32_t interned(std::int32_t deferred) {
    Guard lock(busy_);
    const auto index = static_cast<std::size_t>(static_cast<std::int64_t>(kFirstId) - deferred);
    return index < stacks_.size() ? stacks_[index].interned : -1;
  }
  void remember(std::int32_t deferred, std::int32_t interned) {
    Guard lock(busy_);
    const auto index = static_cast<std::size_t>(static_cast<std::int64_t>(kFirstId) - deferred);
    if (index < stacks_.size()) stacks_[index].interned = interned;
  }

  std::size_t stacks() const {
    Guard lock(busy_);
    return stacks_.size();
  }
  /// Events whose stack could not be kept (a bound reached, or an error): recorded with no stack.
  std::uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }
  /// Stacks cut at kMaxDepth frames (their outermost frames are not kept).
  std::uint64_t truncated() const noexcept { return truncated_.load(std::memory_order_relaxed); }

 private:
  struct RawFrame {
    PyObject* code;      // a code object; referenced once kept
    std::int32_t offset; // the instruction's byte offset (PyCode_Addr2Line's), or -1 when `line` is known
    std::int32_t line;
  };
  struct Walk {
    std::array<RawFrame, kMaxDepth> frames;
    std::size_t count = 0;
    std::uint64_t hash = 0;
  };
  struct Stack {
    std::size_t offset = 0, count = 0;
    std::uint64_t hash = 0;
    std::string thread_name;  // a stack with no Python frame: the thread's name
    std::int32_t interned = -1;
    bool resolved = false;
    std::vector<Frame> frames;
  };

  // This thread's state, whether or not it holds the GIL (its own frames do not change while it runs C code).
  static PyThreadState* own_thread_state() noexcept { return PyGILState_GetThisThreadState(); }

  // Mixes one frame into a stack's hash: a rotation and two exclusive ors, so that the walk's chain of dependent
  // operations stays short; finish() mixes the whole once (MurmurHash3's finaliser). The table's lookup compares
  // the frames themselves, so the hash only has to spread.
  static std::uint64_t mix(std::uint64_t h, const void* code, std::int32_t offset, std::int32_t line) noexcept {
    const std::uint64_t v = reinterpret_cast<std::uintptr_t>(code) ^
                            (static_cast<std::uint64_t>(static_cast<std::uint32_t>(offset)) << 40) ^
                            static_cast<std::uint32_t>(line);
    return ((h << 7) | (h >> 57)) ^ v;
  }
  static std::uint64_t finish(std::uint64_t h) noexcept {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
  }

  // This thread's frames into w, innermost first, with their hash; false when it has none to show.
  bool walk(Walk& w, bool gil) noexcept {
    std::size_t n = 0;
    std::uint64_t h = 0;
    bool deeper = false;
#if OOMFLIGHT_FRAMES_IN_PLACE
    PyThreadState* t = own_thread_state();  // never the GIL holder's: it may be another thread's
    if (t == nullptr || t->cframe == nullptr) return false;
    for (_PyInterpreterFrame* f = t->cframe->current_frame; f != nullptr; f = f->previous) {
      if (_PyFrame_IsIncomplete(f)) continue;  // being set up: CPython's traceback skips these too
      if (n == kMaxDepth) {
        deeper = true;
        break;
      }
      const auto offset = static_cast<std::int32_t>(_PyInterpreterFrame_LASTI(f) * sizeof(_Py_CODEUNIT));
      w.frames[n++] = {reinterpret_cast<PyObject*>(f->f_code), offset, 0};
      h = mix(h, f->f_code, offset, 0);
    }
#else
    if (!gil) return false;                // the public API needs the GIL
    PyFrameObject* f = PyEval_GetFrame();  // borrowed
    Py_XINCREF(f);
    while (f != nullptr) {
      if (n == kMaxDepth) {
        deeper = true;
        Py_DECREF(f);
        break;
      }
      PyCodeObject* code = PyFrame_GetCode(f);  // a new reference: the frame keeps the code alive meanwhile
#if PY_VERSION_HEX >= 0x030B0000
      // The instruction's offset (resolved to a line at the freeze): a line now would scan the line table.
      const int offset = PyFrame_GetLasti(f), line = 0;
#else
      const int offset = -1, line = PyFrame_GetLineNumber(f);
#endif
      w.frames[n++] = {reinterpret_cast<PyObject*>(code), offset, line};
      h = mix(h, code, offset, line);
      Py_DECREF(code);
      PyFrameObject* back = PyFrame_GetBack(f);  // a new reference
      Py_DECREF(f);
      f = back;
    }
#endif
    if (deeper) truncated_.fetch_add(1, std::memory_order_relaxed);
    w.count = n;
    w.hash = finish(h ^ n);
    return n > 0;
  }

  // Open addressing over stack indices, linear probing; a power of two at least twice the stacks kept.
  static constexpr std::uint32_t kNoStack = 0xFFFFFFFFu;
  static std::size_t slot_count(std::size_t max_stacks) {
    std::size_t n = 16;
    while (n < 2 * max_stacks) n <<= 1;
    return n;
  }

  // The stack's deferred id if kept, else -1 (guard held).
  std::int32_t find(const Walk& w) const noexcept {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = w.hash & mask;; i = (i + 1) & mask) {
      const std::uint32_t index = slots_[i];
      if (index == kNoStack) return -1;
      const Stack& s = stacks_[index];
      if (s.hash == w.hash && s.count == w.count &&
          std::memcmp(&frames_[s.offset], w.frames.data(), w.count * sizeof(RawFrame)) == 0) {
        return id_of(index);
      }
    }
  }

  // Keeps a stack seen for the first time (guard and GIL held).
  std::int32_t add(const Walk& w) {
    if (stacks_.size() >= max_stacks_ || frames_.size() + w.count > max_frames_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return -1;
    }
    Stack s;
    s.offset = frames_.size();
    s.count = w.count;
    s.hash = w.hash;
    for (std::size_t k = 0; k < w.count; ++k) {
      Py_INCREF(w.frames[k].code);
      frames_.push_back(w.frames[k]);
    }
    stacks_.push_back(std::move(s));
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = w.hash & mask;
    while (slots_[i] != kNoStack) i = (i + 1) & mask;
    slots_[i] = static_cast<std::uint32_t>(stacks_.size() - 1);
    return id_of(stacks_.size() - 1);
  }

  // A thread with no Python frame to show: a stack of its name, one per thread (cached by the thread).
  std::int32_t named_thread() {
    thread_local std::int32_t cached = -1;
    thread_local const PythonStacks* owner = nullptr;
    if (owner == this && cached != -1) return cached;
    Guard lock(busy_);
    cached = named_thread_locked();
    owner = this;
    return cached;
  }

  std::int32_t named_thread_locked() {
    char name[32] = {};
    if (pthread_getname_np(pthread_self(), name, sizeof name) != 0 || name[0] == '\0') {
      std::strcpy(name, "unnamed");
    }
    for (std::size_t i = 0; i < stacks_.size(); ++i) {
      if (stacks_[i].thread_name == name) return id_of(i);
    }
    if (stacks_.size() >= max_stacks_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return -1;
    }
    Stack s;
    s.thread_name = name;
    stacks_.push_back(std::move(s));
    return id_of(stacks_.size() - 1);
  }

  static std::int32_t id_of(std::size_t index) noexcept {
    return static_cast<std::int32_t>(static_cast<std::int64_t>(kFirstId) - static_cast<std::int64_t>(index));
  }

  // With the GIL: the code object's qualified name, file and the offset's line; names as Python holds them
  // (python_text: a lone surrogate or a NUL is escaped, never dropped).
  Frame resolve_frame(const RawFrame& f) {
    auto* code = reinterpret_cast<PyCodeObject*>(f.code);
#if PY_VERSION_HEX >= 0x030B0000
    std::string function = python_text(code->co_qualname);
#else
    std::string function = python_text(code->co_name);
#endif
    const int line = f.offset >= 0 ? line_of(code, f.offset) : f.line;
    return {std::move(function), python_text(code->co_filename), line > 0 ? line : 0};
  }

  // The line of an instruction offset. PyCode_Addr2Line scans the code's line table from its start on every call:
  // the deep frames of a 20,000-line function, thousands of distinct offsets, took symbolising past its 2 s limit
  // (issue 39). So each code object's table is read once (co_lines(), 3.10+: (start, end, line) ranges in order)
  // and searched; at most kMaxLineRanges ranges are kept in all (12 bytes each), past that PyCode_Addr2Line.
  static constexpr std::size_t kMaxLineRanges = std::size_t{1} << 20;
  struct LineRange {
    std::int32_t start, end, line;  // line -1: none (an artificial instruction)
  };

  int line_of(PyCodeObject* code, int offset) {
#if PY_VERSION_HEX >= 0x030A0000
    auto it = line_tables_.find(code);
    if (it == line_tables_.end() && line_ranges_ < kMaxLineRanges) {
      it = line_tables_.emplace(code, read_line_table(code)).first;
      line_ranges_ += it->second.size();
    }
    if (it != line_tables_.end() && !it->second.empty()) {
      const std::vector<LineRange>& table = it->second;
      auto at = std::upper_bound(table.begin(), table.end(), offset,
                                 [](int value, const LineRange& r) { return value < r.start; });
      if (at != table.begin()) {
        --at;
        if (offset < at->end) return at->line;
      }
      return -1;
    }
#endif
    return PyCode_Addr2Line(code, offset);
  }

  // code.co_lines() as ranges, or none when it cannot be read (then PyCode_Addr2Line answers).
  static std::vector<LineRange> read_line_table(PyCodeObject* code) {
    std::vector<LineRange> out;
    PyObject* lines = PyObject_CallMethod(reinterpret_cast<PyObject*>(code), "co_lines", nullptr);
    PyObject* iterator = lines != nullptr ? PyObject_GetIter(lines) : nullptr;
    Py_XDECREF(lines);
    if (iterator == nullptr) {
      PyErr_Clear();
      return out;
    }
    bool ok = true;
    while (PyObject* item = PyIter_Next(iterator)) {
      long start = 0, end = 0, line = -1;
      if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3) {
        start = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
        end = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
        PyObject* l = PyTuple_GET_ITEM(item, 2);
        line = l == Py_None ? -1 : PyLong_AsLong(l);
      } else {
        ok = false;
      }
      Py_DECREF(item);
      if (!ok || PyErr_Occurred()) {
        ok = false;
        break;
      }
      out.push_back({static_cast<std::int32_t>(start), static_cast<std::int32_t>(end),
                     static_cast<std::int32_t>(line)});
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) {  // the iteration failed part-way: no table, PyCode_Addr2Line answers
      PyErr_Clear();
      ok = false;
    }
    if (!ok || !std::is_sorted(out.begin(), out.end(),
                               [](const LineRange& a, const LineRange& b) { return a.start < b.start; })) {
      out.clear();
    }
    return out;
  }

  // A spin lock: held for a lookup (tens of ns), or an insertion of a first-seen stack; contended only by threads
  // without the GIL, which rarely get this far (a thread's name is cached). std::mutex costs more uncontended.
  class Guard {
   public:
    explicit Guard(std::atomic_flag& flag) noexcept : flag_(flag) {
      while (flag_.test_and_set(std::memory_order_acquire)) {
      }
    }
    ~Guard() { flag_.clear(std::memory_order_release); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    std::atomic_flag& flag_;
  };

  const std::size_t max_stacks_, max_frames_;
  mutable std::atomic_flag busy_ = ATOMIC_FLAG_INIT;
  std::vector<Stack> stacks_;
  std::vector<RawFrame> frames_;
  std::vector<std::uint32_t> slots_;
  std::atomic<std::uint64_t> dropped_{0}, truncated_{0};
  // Read under the GIL only (resolve()): each kept code object's line table, kMaxLineRanges at most in all.
  std::unordered_map<PyCodeObject*, std::vector<LineRange>> line_tables_;
  std::size_t line_ranges_ = 0;
};

}  // namespace oomflight::torch_plugin
