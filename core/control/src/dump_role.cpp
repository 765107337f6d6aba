#include "dump_role.hpp"

#include "dump_executor.hpp"

namespace oomflight {

int freeze_device(DumpEntry entry, const DumpLedger& ledger) {
  return entry == DumpEntry::rejoined ? ledger.joint_request().device : -1;
}

DumpRole settle_role(DumpLedger& ledger, std::mutex& mutex, std::condition_variable& cv, DumpEntry entry,
                     const FrozenHistory& h, int rank, DumpRequest& request) {
  DumpRole role;
  {
    std::lock_guard lock(mutex);
    switch (entry) {
      case DumpEntry::asked:
        ledger.asked(h.oom_events);
        role.origin = true;
        break;
      case DumpEntry::rejoined:
        ledger.rejoined(h.oom_events);
        role.origin = true;
        break;
      case DumpEntry::heard:
        // An oom event no dump has reported makes this rank an origin even if its request comes later: two ranks
        // that fail at the same moment are both named, whatever order their messages arrive in.
        role.through_event = ledger.origin_through_event(h.oom_events);
        role.origin = role.through_event;
        break;
    }
  }
  if (role.through_event) {
    request = request_from_oom_event(h);
    announce_dump(request, rank, h.batch);  // before its failing thread's request says its words
  }
  {
    std::lock_guard lock(mutex);
    ledger.decided();
  }
  cv.notify_all();
  return role;
}

}  // namespace oomflight
