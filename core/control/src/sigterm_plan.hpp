// What a SIGTERM that oomflight's handler caught does on a rank (dump_signal.hpp installs the handler): one rule for
// both transports, one dump per ending.
#pragma once

namespace oomflight {

/// What a SIGTERM caught by oomflight's handler does on a rank: one dump per ending, the same rule over both
/// transports (issue 40: over the store, a second exit dump per rank waited the whole deadline for a rank that had
/// already gone).
struct SigtermPlan {
  bool exit_dump = false;  ///< ask every rank for an exit dump first (else: end after the dump under way, if any)
  const char* why = "";    ///< end_by_sigterm_saying()'s words once that is done
};

/// `exit_dumped`: this rank took part in an exit dump already; `leaving`: it is leaving at its normal end (or left);
/// `dump_on_exit`: OOMFLIGHT_DUMP_ON_EXIT; `coordinated`: the ranks agreed to coordinate their dumps. In that order:
/// after an exit dump, or while leaving, the process ends with no dump; else with OOMFLIGHT_DUMP_ON_EXIT and
/// coordinated ranks, an exit dump of every rank comes first; else the process ends once the dump under way (if any)
/// is done. Pure.
SigtermPlan plan_sigterm(bool exit_dumped, bool leaving, bool dump_on_exit, bool coordinated);

}  // namespace oomflight
