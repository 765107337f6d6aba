// The job's c10d store as oomflight's transport (oomflight_store, oomflight.h): how a job that no MPI launcher
// started (torchrun, the trainers' own launchers) dumps every rank into one archive. The Python side
// (oomflight/torch.py, _join_job_store) picks the store: a client of its own on the job's TCPStore endpoint (so
// that oomflight's round trips never queue behind the job's own use of its client), under a prefix of oomflight's.
//
// Every call here is C++ on c10d::Store: no Python object and no GIL after join_store returns, so oomflight's
// watcher thread and a thread that ran out of memory may call it while the job's main thread holds the GIL.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace oomflight::torch_plugin {

// Mirrors struct oomflight_store (oomflight.h, ABI 1, with 0.3's `release`): the extension includes no oomflight
// header, it receives the C API's addresses from Python (docs/pytorch.md). A liboomflight older than 0.3 reads the
// first six fields only (struct_size), and never releases.
struct StoreTable {
  std::size_t struct_size;
  void* user;
  int (*set)(void* user, const char* key, const void* value, std::size_t size);
  int (*get)(void* user, const char* key, void* buffer, std::size_t capacity, std::size_t* size);
  int (*add)(void* user, const char* key, std::int64_t delta, std::int64_t* value);
  const char* (*last_error)(void* user);
  void (*release)(void* user);
};

class JobStore {
 public:
  // `keep`: the job's own store (may be null), held as long as oomflight uses `store`, a client of its own on the
  // same endpoint: on the rank whose store hosts the TCPStore server, the server then lives until this rank has
  // left (the leave agreement at the session's end), not only until Python's finalisation drops the job's
  // reference (the other ranks' last round trips found it gone, and torch logged each failure with its stack).
  JobStore(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Store> keep)
      : store_(std::move(store)), keep_(std::move(keep)) {}

  StoreTable table() {
    return StoreTable{sizeof(StoreTable), this,      &JobStore::set, &JobStore::get, &JobStore::add,
                      &JobStore::last_error, &JobStore::release};
  }

 private:
  static JobStore& of(void* user) { return *static_cast<JobStore*>(user); }
  // The message of this thread's last failure (c10d throws c10::Error, std::runtime_error and friends).
  static std::string& error_text() {
    thread_local std::string text;
    return text;
  }
  static int failed(const std::exception& e) {
    error_text() = e.what();
    return -1;
  }

  static int set(void* user, const char* key, const void* value, std::size_t size) {
    try {
      const auto* bytes = static_cast<const std::uint8_t*>(value);
      of(user).store_->set(key, std::vector<std::uint8_t>(bytes, bytes + size));
      return 0;
    } catch (const std::exception& e) {
      return failed(e);
    }
  }
  // check() first: c10d's get() waits for a missing key until the store's timeout.
  static int get(void* user, const char* key, void* buffer, std::size_t capacity, std::size_t* size) {
    try {
      c10d::Store& store = *of(user).store_;
      if (!store.check({key})) return 0;
      const std::vector<std::uint8_t> value = store.get(key);
      *size = value.size();
      std::memcpy(buffer, value.data(), std::min(capacity, value.size()));
      return 1;
    } catch (const std::exception& e) {
      return failed(e);
    }
  }
  static int add(void* user, const char* key, std::int64_t delta, std::int64_t* value) {
    try {
      *value = of(user).store_->add(key, delta);
      return 0;
    } catch (const std::exception& e) {
      return failed(e);
    }
  }
  static const char* last_error(void*) { return error_text().c_str(); }
  // liboomflight's last use of the store: our reference goes (no GIL needed: c10d's Store is C++ with an atomic
  // count), so that the store ends when the job drops its own (destroy_process_group, or the process's end).
  static void release(void* user) { delete &of(user); }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Store> keep_;
};

// join_store(address, store, rank, world_size, local_rank, keep): hands `store` (a torch.distributed Store) to
// oomflight_join_store at `address`, holding `keep` (the job's own store, or None) with it. Returns "" or the reason it
// did not join. Both are kept until liboomflight
// releases it (oomflight_leave_store at destroy_process_group, or the session's end); a liboomflight older than 0.3
// keeps it until the process ends.
inline std::string join_store(std::uintptr_t address, pybind11::handle store, int rank, int world_size,
                              int local_rank, pybind11::handle keep) {
  if (address == 0) return "this liboomflight has no oomflight_join_store (older than 0.2.1)";
  auto* raw = pybind11::cast<c10d::Store*>(store);
  if (raw == nullptr) return "no store";
  auto* kept = keep.is_none() ? nullptr : pybind11::cast<c10d::Store*>(keep);
  // The Python objects' holders keep one reference each; these are ours, until liboomflight releases them.
  auto* job_store = new JobStore(c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(raw),
                                 kept == nullptr ? c10::intrusive_ptr<c10d::Store>()
                                                 : c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(kept));
  const StoreTable table = job_store->table();
  using Join = int(const StoreTable*, int, int, int);
  const int rc = reinterpret_cast<Join*>(address)(&table, rank, world_size, local_rank);
  if (rc != 0) {
    delete job_store;  // a join that failed never releases: the store is still ours
    return "oomflight_join_store failed (" + std::to_string(rc) + ")";
  }
  return {};
}

}  // namespace oomflight::torch_plugin
