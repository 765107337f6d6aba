// Table-driven out-of-memory classification.
#include "oomflight/control/oom_classifier.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

namespace oomflight {
namespace {

enum class Where { type_exact, type_contains, message_contains, either_contains };

struct Rule {
  Where where;
  std::string_view pattern;  // lower case for *_contains rules; exact spelling for type_exact
  OomKind kind;
};

// Most specific first: a torch error whose message mentions "CUDA out of memory" is a torch OOM.
constexpr std::array<Rule, 19> kRules = {{
    {Where::type_exact, "torch.OutOfMemoryError", OomKind::torch},
    {Where::type_exact, "torch.cuda.OutOfMemoryError", OomKind::torch},
    {Where::type_exact, "OutOfMemoryError", OomKind::torch},
    {Where::type_contains, "resourceexhaustederror", OomKind::xla},
    {Where::message_contains, "resource_exhausted", OomKind::xla},
    {Where::either_contains, "cudaerrormemoryallocation", OomKind::cuda},
    {Where::either_contains, "cuda_error_out_of_memory", OomKind::cuda},
    {Where::either_contains, "hiperroroutofmemory", OomKind::hip},
    {Where::message_contains, "hip out of memory", OomKind::hip},
    {Where::message_contains, "cuda failure 'out of memory'", OomKind::nccl},
    {Where::type_exact, "std::bad_alloc", OomKind::host},
    {Where::type_exact, "bad_alloc", OomKind::host},
    {Where::type_exact, "MemoryError", OomKind::host},  // Python's host out-of-memory (builtins)
    {Where::type_exact, "builtins.MemoryError", OomKind::host},
    {Where::message_contains, "std::bad_alloc", OomKind::host},
    {Where::message_contains, "out of memory", OomKind::message},
    {Where::message_contains, "resource exhausted", OomKind::message},
    {Where::message_contains, "failed to allocate", OomKind::message},
    {Where::message_contains, "allocation failed", OomKind::message},
}};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::string_view oom_kind_name(OomKind kind) {
  switch (kind) {
    case OomKind::none: return "none";
    case OomKind::torch: return "torch";
    case OomKind::xla: return "xla";
    case OomKind::cuda: return "cuda";
    case OomKind::hip: return "hip";
    case OomKind::nccl: return "nccl";
    case OomKind::host: return "host";
    case OomKind::message: return "message";
  }
  return "none";
}

OomKind classify_oom(std::string_view type_name, std::string_view message) {
  const std::string type_lc = lower(type_name);
  const std::string message_lc = lower(message);
  for (const auto& rule : kRules) {
    bool hit = false;
    switch (rule.where) {
      case Where::type_exact: hit = type_name == rule.pattern; break;
      case Where::type_contains: hit = type_lc.find(rule.pattern) != std::string::npos; break;
      case Where::message_contains: hit = message_lc.find(rule.pattern) != std::string::npos; break;
      case Where::either_contains:
        hit = type_lc.find(rule.pattern) != std::string::npos || message_lc.find(rule.pattern) != std::string::npos;
        break;
    }
    if (hit) return rule.kind;
  }
  return OomKind::none;
}

}  // namespace oomflight
