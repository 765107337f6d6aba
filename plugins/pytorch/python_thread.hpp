// What a thread of the torch extension may know about the interpreter without trusting what it cannot know: whether
// this thread holds the GIL, whether the interpreter is finalising, and a Python string's text exactly as Python holds
// it. Every function here is safe to call from any thread, with or without the GIL, unless it says otherwise.
//
// Why not PyGILState_Check(): once a sub-interpreter exists (Py_NewInterpreter, `_xxsubinterpreters.create()`),
// CPython turns its check off and PyGILState_Check() answers 1 on every thread (pystate.c, 3.9 - 3.12: "if
// (!gilstate->check_enabled) return 1"), so a native thread of the allocator would read another thread's frames or
// die in PyThreadState_Get ("the function must be called with the GIL held"). holds_gil() compares the thread state
// that holds the GIL with this thread's own instead, as PyGILState_Check does when its check is on.
#pragma once

#include <Python.h>

#include <string>

namespace oomflight::torch_plugin {

/// True only when this thread holds the GIL of the main interpreter with its own thread state. A native thread (no
/// thread state), a thread whose thread state is detached (it released the GIL), a thread running a
/// sub-interpreter's code and a thread started inside one all get false. Never takes the GIL; never fails.
inline bool holds_gil() noexcept {
  // This thread's own thread state (the GIL-state TSS key: set for threads Python created or PyGILState_Ensure
  // made), without the GIL; nullptr for a thread that never ran Python.
  PyThreadState* mine = PyGILState_GetThisThreadState();
  if (mine == nullptr) return false;
#if PY_VERSION_HEX >= 0x030D0000
  PyThreadState* holder = PyThreadState_GetUnchecked();  // this thread's attached state (a thread local)
#else
  // 3.12: this thread's attached state (a thread local); 3.9 - 3.11: the state holding the GIL, of any thread (a
  // global): equal to `mine` only when this thread holds it, since only this thread swaps its own state in.
  PyThreadState* holder = _PyThreadState_UncheckedGet();
#endif
  // A thread started inside a sub-interpreter owns the GIL-state slot with that interpreter's state: never ours.
  return holder == mine && PyThreadState_GetInterpreter(mine) == PyInterpreterState_Main();
}

/// Whether the interpreter is finalising (its flag, read without the GIL). A thread other than the finalising one
/// that takes the GIL then is ended by the interpreter (pthread_exit, from take_gil: 3.9 - 3.13).
inline bool python_finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

/// Whether a helper may take the GIL now: the interpreter is up and not finalising. (It may begin finalising just
/// after: a helper that takes the GIL must let pthread_exit's unwinding through, never run it in a noexcept frame.)
inline bool python_usable() noexcept { return Py_IsInitialized() != 0 && !python_finalizing(); }

/// `text` with every NUL byte written as the four characters "\x00", so that the C API's NUL-terminated strings
/// keep what follows it.
inline std::string escape_nul(std::string text) {
  for (std::size_t at = text.find('\0'); at != std::string::npos; at = text.find('\0', at + 4)) {
    text.replace(at, 1, "\\x00");
  }
  return text;
}

/// A str object's text as UTF-8, exactly as Python holds it: a lone surrogate (a file name of undecodable bytes,
/// `def f\udcff`) is written as Python's backslashreplace writes it ("\udcff"), a NUL as "\x00"; never dropped. ""
/// for nullptr or a non-str. The GIL must be held. Never leaves a Python error set; throws std::bad_alloc only.
inline std::string python_text(PyObject* s) {
  if (s == nullptr || !PyUnicode_Check(s)) return "";
  Py_ssize_t size = 0;
  if (const char* utf8 = PyUnicode_AsUTF8AndSize(s, &size)) return escape_nul(std::string(utf8, size));
  PyErr_Clear();  // not encodable as strict UTF-8: a lone surrogate
  PyObject* bytes = PyUnicode_AsEncodedString(s, "utf-8", "backslashreplace");
  if (bytes == nullptr) {
    PyErr_Clear();
    return "<a name Python could not encode>";
  }
  std::string text(PyBytes_AS_STRING(bytes), static_cast<std::size_t>(PyBytes_GET_SIZE(bytes)));
  Py_DECREF(bytes);
  return escape_nul(std::move(text));
}

}  // namespace oomflight::torch_plugin
