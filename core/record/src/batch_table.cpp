// The per-batch table's ring.
#include "oomflight/record/batch_table.hpp"

#include <new>
#include <stdexcept>

namespace oomflight {

BatchTable::BatchTable(std::size_t max_rows) : max_rows_(max_rows) {
  if (max_rows == 0) throw std::invalid_argument("a batch table needs at least one row");
}

bool BatchTable::push(const BatchStats& row) noexcept {
  const std::lock_guard lock(mutex_);
  if (rows_.size() < max_rows_) {
    try {
      rows_.push_back(row);
    } catch (const std::bad_alloc&) {
      ++overwritten_;
      return false;
    }
    return true;
  }
  rows_[next_] = row;
  next_ = (next_ + 1) % max_rows_;
  ++overwritten_;
  return true;
}

BatchTableCopy BatchTable::copy() const {
  const std::lock_guard lock(mutex_);
  BatchTableCopy c;
  c.overwritten = overwritten_;
  c.rows.reserve(rows_.size());
  c.rows.insert(c.rows.end(), rows_.begin() + static_cast<std::ptrdiff_t>(next_), rows_.end());
  c.rows.insert(c.rows.end(), rows_.begin(), rows_.begin() + static_cast<std::ptrdiff_t>(next_));
  return c;
}

}  // namespace oomflight
