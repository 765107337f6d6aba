// The frames worth showing: see user_frames.hpp.
#include "oomflight/export/user_frames.hpp"

#include <fmt/format.h>

#include "oomflight/base/printable.hpp"

namespace oomflight {

bool allocator_frame(std::string_view function, std::string_view file) {
  static constexpr std::string_view kInternals[] = {
      "CUDACachingAllocator", "torch::unwind",        "c10::cuda::",         "at::native::empty",
      "at::empty",            "at::detail::empty",    "_empty_generic",      "empty_strided",
      "gather_with_cpp",      "memory_snapshot.cpp",  "c10::impl::",         "torch/cuda/memory.py",
      "torch/cuda/_memory_viz.py", "oomflight::"};
  // oomflight's own Python package, by its files: a bare "oomflight" would also hide a user's frames whenever a
  // folder of theirs is named after it (a checkout, a scratch folder /tmp/oomflight-...).
  static constexpr std::string_view kPackage[] = {"/oomflight/__init__.py", "/oomflight/oom.py", "/oomflight/torch.py",
                                                  "/oomflight/_", "/oomflight/integrations/"};
  for (const auto word : kInternals) {
    if (function.find(word) != std::string_view::npos || file.find(word) != std::string_view::npos) return true;
  }
  for (const auto path : kPackage) {
    if (file.find(path) != std::string_view::npos) return true;
  }
  return false;
}

bool allocator_frame(const Archive& a, const FrameRow& f) {
  return allocator_frame(a.string(f.function), a.string(f.file));
}

std::vector<std::size_t> frames_to_show(std::span<const FrameText> frames, std::size_t n) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < frames.size() && out.size() < n; ++i) {
    const std::string_view file = frames[i].file;
    if (file.size() > 3 && file.substr(file.size() - 3) == ".py" && !allocator_frame(frames[i].function, file)) {
      out.push_back(i);
    }
  }
  if (!out.empty()) return out;
  for (std::size_t i = 0; i < frames.size() && out.size() < n; ++i) {
    if (frames[i].file != "??" && !allocator_frame(frames[i].function, frames[i].file)) out.push_back(i);
  }
  return out;
}

std::vector<const FrameRow*> frames_to_show(const Archive& a, std::int32_t stack_id, std::size_t n) {
  const auto all = a.stack(stack_id);
  std::vector<FrameText> text;
  text.reserve(all.size());
  for (const FrameRow* f : all) text.push_back(FrameText{a.string(f->function), a.string(f->file), f->line});
  std::vector<const FrameRow*> out;
  for (std::size_t i : frames_to_show(text, n)) out.push_back(all[i]);
  return out;
}

std::string frame_lines(const Archive& a, std::int32_t stack_id, std::size_t n, std::string_view indent) {
  std::string out;
  for (const FrameRow* f : frames_to_show(a, stack_id, n)) {
    // C++ frames spell out their template arguments: keep a line readable.
    const auto function = a.string(f->function);
    out += fmt::format("{}{}{} ({}:{})\n", indent, printable(function.substr(0, 120)),
                       function.size() > 120 ? "..." : "", printable(a.string(f->file)), f->line);
  }
  return out;
}

}  // namespace oomflight
