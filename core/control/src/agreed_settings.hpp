// The settings every rank of a job must share, and the words that name a mismatch (internal to the control wing).
//
// Both transports compare the same variables at start (settings_agreement.hpp over MPI, the hellos of
// store_protocol.hpp over the job's store) and must say a mismatch in the same words, values in the order of the
// lowest rank that holds each (issue 40: the store path ordered them by their text). Nothing here needs MPI.
#pragma once

#include <string>
#include <vector>

#include "oomflight/control/config.hpp"

namespace oomflight {

/// The variables compared, in the order their mismatches are named.
inline constexpr const char* kAgreedSettings[] = {"OOMFLIGHT_ENABLED", "OOMFLIGHT_SKIP_BATCHES", "OOMFLIGHT_INTERVAL",
                                                  "OOMFLIGHT_SNAPSHOT_EVERY"};

/// This rank's value of each of kAgreedSettings, as a mismatch prints them ("1", "unset", "4ba"). Never throws
/// but std::bad_alloc.
std::vector<std::string> agreed_setting_values(const Config& config);

/// "0", "0-3", "0, 2-3, 7": ascending ranks with runs collapsed. `ranks` must be sorted ascending.
std::string rank_ranges(const std::vector<int>& ranks);

/// What differs between ranks, in the words both transports use: `values[r]` is rank r's agreed_setting_values(),
/// or empty when rank r could not start (its settings did not parse, or its history could not be allocated).
/// Returns "" when every rank started and all agree; else each variable that differs, with its values in the order
/// of the lowest rank holding each and the ranks that hold them ("OOMFLIGHT_SNAPSHOT_EVERY differs between ranks:
/// unset on ranks 0, 2-3; 1ba on rank 1"), then the ranks that could not start, joined by "; and ", and, when any
/// value differs, ". These settings must be the same on every rank of the job". The caller adds what follows
/// (MPI: no rank starts; the store: no dump is coordinated).
std::string settings_mismatch(const std::vector<std::vector<std::string>>& values);

}  // namespace oomflight
