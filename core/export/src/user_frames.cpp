// The frames worth showing: see user_frames.hpp.
#include "oomflight/export/user_frames.hpp"

#include <string_view>

namespace oomflight {

bool allocator_frame(const Archive& a, const FrameRow& f) {
  static constexpr std::string_view kInternals[] = {
      "CUDACachingAllocator", "torch::unwind",        "c10::cuda::",         "at::native::empty",
      "at::empty",            "at::detail::empty",    "_empty_generic",      "empty_strided",
      "gather_with_cpp",      "memory_snapshot.cpp",  "c10::impl::",         "torch/cuda/memory.py",
      "torch/cuda/_memory_viz.py", "oomflight::"};
  // oomflight's own Python package, by its files: a bare "oomflight" would also hide a user's frames whenever a
  // folder of theirs is named after it (a checkout, a scratch folder /tmp/oomflight-...).
  static constexpr std::string_view kPackage[] = {"/oomflight/__init__.py", "/oomflight/oom.py", "/oomflight/torch.py",
                                                  "/oomflight/_", "/oomflight/integrations/"};
  const auto function = a.string(f.function);
  const auto file = a.string(f.file);
  for (const auto word : kInternals) {
    if (function.find(word) != std::string_view::npos || file.find(word) != std::string_view::npos) return true;
  }
  for (const auto path : kPackage) {
    if (file.find(path) != std::string_view::npos) return true;
  }
  return false;
}

std::vector<const FrameRow*> frames_to_show(const Archive& a, std::int32_t stack_id, std::size_t n) {
  const auto all = a.stack(stack_id);
  std::vector<const FrameRow*> out;
  for (const auto* f : all) {
    const auto file = a.string(f->file);
    if (file.size() > 3 && file.substr(file.size() - 3) == ".py" && !allocator_frame(a, *f) && out.size() < n) {
      out.push_back(f);
    }
  }
  if (!out.empty()) return out;
  for (const auto* f : all) {
    if (out.size() >= n) break;
    if (a.string(f->file) != "??" && !allocator_frame(a, *f)) out.push_back(f);
  }
  return out;
}

}  // namespace oomflight
