// Symbol visibility for liboomflight: everything is hidden unless marked OOMFLIGHT_API.
#pragma once

#if defined(_WIN32)
#define OOMFLIGHT_API __declspec(dllexport)
#else
#define OOMFLIGHT_API __attribute__((visibility("default")))
#endif
