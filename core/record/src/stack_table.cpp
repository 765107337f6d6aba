// StackTable: hash-consing of strings, frames and stacks behind one mutex.
#include "oomflight/record/stack_table.hpp"

#include <limits>
#include <stdexcept>

namespace oomflight {

std::uint32_t StackTable::intern_string(std::string_view s) {
  auto it = string_ids_.find(s);
  if (it != string_ids_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(table_.strings.size());
  table_.strings.emplace_back(s);
  string_ids_.emplace(std::string(s), id);
  return id;
}

std::uint32_t StackTable::intern_frame_locked(const FrameRef& f) {
  const FrameKey key{intern_string(f.function), intern_string(f.file), f.line};
  auto it = frame_ids_.find(key);
  if (it != frame_ids_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(table_.frames.size());
  table_.frames.push_back(InternedFrame{key.function, key.file, key.line});
  frame_ids_.emplace(key, id);
  return id;
}

std::uint32_t StackTable::intern_frame(const FrameRef& frame) {
  std::lock_guard lock(mutex_);
  return intern_frame_locked(frame);
}

std::int32_t StackTable::intern(std::span<const FrameRef> frames) {
  std::lock_guard lock(mutex_);
  scratch_.clear();
  for (const auto& f : frames) scratch_.push_back(intern_frame_locked(f));
  return intern_scratch_locked();
}

std::int32_t StackTable::intern_frame_ids(std::span<const std::uint32_t> frame_ids) {
  std::lock_guard lock(mutex_);
  for (const std::uint32_t id : frame_ids) {
    if (id >= table_.frames.size()) throw std::invalid_argument("intern_frame_ids: not a frame id of this table");
  }
  scratch_.assign(frame_ids.begin(), frame_ids.end());
  return intern_scratch_locked();
}

std::int32_t StackTable::intern_scratch_locked() {
  const std::string_view bytes(reinterpret_cast<const char*>(scratch_.data()), scratch_.size() * sizeof(std::uint32_t));
  auto it = stack_ids_.find(bytes);
  if (it != stack_ids_.end()) return it->second;
  std::string key(bytes);
  if (table_.stacks.size() >= static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    throw std::length_error("stack table is full (2^31 stacks)");
  }
  const auto id = static_cast<std::int32_t>(table_.stacks.size());
  table_.stacks.push_back(InternedStack{table_.stack_frames.size(), static_cast<std::uint32_t>(scratch_.size())});
  table_.stack_frames.insert(table_.stack_frames.end(), scratch_.begin(), scratch_.end());
  stack_ids_.emplace(std::move(key), id);
  return id;
}

StackTableCopy StackTable::copy() const {
  std::lock_guard lock(mutex_);
  return table_;
}

std::size_t StackTable::size() const {
  std::lock_guard lock(mutex_);
  return table_.stacks.size();
}

}  // namespace oomflight
