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

// Mirrors struct oomflight_store (oomflight.h, ABI 1): the extension includes no oomflight header, it receives
// the C API's addresses from Python (docs/pytorch.md).
struct StoreTable {
  std::size_t struct_size;
  void* user;
  int (*set)(void* user, const char* key, const void* value, std::size_t size);
  int (*get)(void* user, const char* key, void* buffer, std::size_t capacity, std::size_t* size);
  int (*add)(void* user, const char* key, std::int64_t delta, std::int64_t* value);
  const char* (*last_error)(void* user);
};

class JobStore {
 public:
  explicit JobStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  StoreTable table() {
    return StoreTable{sizeof(StoreTable), this, &JobStore::set, &JobStore::get, &JobStore::add,
                      &JobStore::last_error};
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

  c10::intrusive_ptr<c10d::Store> store_;
};

// join_store(address, store, rank, world_size, local_rank): hands `store` (a torch.distributed Store) to
// oomflight_join_store at `address`. Returns "" or the reason it did not join. The store is kept until the
// process ends (oomflight never releases it: a dump may be under way at exit).
inline std::string join_store(std::uintptr_t address, pybind11::handle store, int rank, int world_size,
                              int local_rank) {
  if (address == 0) return "this liboomflight has no oomflight_join_store (older than 0.2.1)";
  auto* raw = pybind11::cast<c10d::Store*>(store);
  if (raw == nullptr) return "no store";
  // The Python object's holder keeps one reference; this one is ours, for the life of the process.
  auto* job_store = new JobStore(c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(raw));
  const StoreTable table = job_store->table();
  using Join = int(const StoreTable*, int, int, int);
  const int rc = reinterpret_cast<Join*>(address)(&table, rank, world_size, local_rank);
  if (rc != 0) {
    delete job_store;
    return "oomflight_join_store failed (" + std::to_string(rc) + ")";
  }
  return {};
}

}  // namespace oomflight::torch_plugin
