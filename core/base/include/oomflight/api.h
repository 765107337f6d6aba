/* Symbol visibility for liboomflight: one macro, OOMFLIGHT_API, marks every public symbol. Everything else is
 * hidden (the library is built with -fvisibility=hidden), so a library loaded into a foreign process (a PyTorch
 * extension, an NCCL plugin, a CUDA injection) exports only its entry points and cannot clash with the host's
 * own copies of fmt, spdlog or MPI wrappers.
 *
 * While the library itself is compiled, OOMFLIGHT_BUILDING_LIBRARY is defined and OOMFLIGHT_API exports the
 * symbol; everywhere else it imports it (the same attribute on ELF, __declspec(dllimport) on Windows). Define
 * OOMFLIGHT_STATIC when linking a static build. C and C++. */
#ifndef OOMFLIGHT_API_H
#define OOMFLIGHT_API_H

#if defined(OOMFLIGHT_STATIC)
#define OOMFLIGHT_API
#elif defined(_WIN32)
#if defined(OOMFLIGHT_BUILDING_LIBRARY)
#define OOMFLIGHT_API __declspec(dllexport)
#else
#define OOMFLIGHT_API __declspec(dllimport)
#endif
#else
#define OOMFLIGHT_API __attribute__((visibility("default")))
#endif

/* OOMFLIGHT_DEPRECATED(message): a compiler warning at every call of a function kept only for old callers. */
#if defined(OOMFLIGHT_BUILDING_LIBRARY)
#define OOMFLIGHT_DEPRECATED(message)
#elif defined(__GNUC__) || defined(__clang__)
#define OOMFLIGHT_DEPRECATED(message) __attribute__((deprecated(message)))
#elif defined(_MSC_VER)
#define OOMFLIGHT_DEPRECATED(message) __declspec(deprecated(message))
#else
#define OOMFLIGHT_DEPRECATED(message)
#endif

#endif /* OOMFLIGHT_API_H */
