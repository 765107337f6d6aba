// RAII for HDF5 identifiers (internal to core).
#pragma once

#include <hdf5.h>

#include <utility>

namespace oomflight::h5 {

/// Owns one hid_t and closes it with the matching H5*close function.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  /// Closes now; returns false when the close failed (for files: the data may not be on disk).
  bool reset() {
    bool ok = true;
    if (id_ >= 0 && closer_) ok = closer_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  operator hid_t() const { return id_; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

inline Handle type(hid_t id) { return Handle(id, H5Tclose); }
inline Handle space(hid_t id) { return Handle(id, H5Sclose); }
inline Handle plist(hid_t id) { return Handle(id, H5Pclose); }
inline Handle dset(hid_t id) { return Handle(id, H5Dclose); }
inline Handle attr(hid_t id) { return Handle(id, H5Aclose); }
inline Handle file(hid_t id) { return Handle(id, H5Fclose); }

/// File access properties for every file oomflight opens or creates. HDF5 1.10.7 and later flock() each file
/// they open and fail where the file system has no flock (Lustre mounted without it, some NFS), or where another
/// process holds a lock: an archive must be written and read there all the same. oomflight writes each file from
/// one process under a .partial name, so the lock protects nothing it needs.
inline Handle file_access() {
  Handle fapl = plist(H5Pcreate(H5P_FILE_ACCESS));
#if H5_VERSION_GE(1, 10, 7)
  H5Pset_file_locking(fapl, false, true);
#endif
  return fapl;
}

}  // namespace oomflight::h5
