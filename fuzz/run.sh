#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in BUILD_DIR, runs every input of the checked-in corpus
# through them and checks each outcome (accepted, or refused with the expected words), then fuzzes each target
# for SECONDS (default 20) from that corpus. Any crash, sanitizer report, stray exception or wrong outcome fails.
#
# Usage: fuzz/run.sh BUILD_DIR [SECONDS]        (ctest runs it as fuzz.corpus; fuzz/README.md)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$1"
seconds="${2:-20}"
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found: apt-get install clang libclang-rt-14-dev" >&2; exit 1; }

CC=clang CXX=clang++ cmake -S "$here/.." -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOOMFLIGHT_FUZZ=ON \
  -DOOMFLIGHT_BUILD_TESTS=OFF -DOOMFLIGHT_BUILD_EXAMPLES=OFF -DOOMFLIGHT_BUILD_BENCH=OFF >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log" >&2; exit 1; }
cmake --build "$build" --target oomflight_fuzz_pickle oomflight_fuzz_archive

# LeakSanitizer on: a leak is a finding. HDF5 keeps its free lists until exit, which LSan does not count as leaks.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0

# Each corpus file's expected outcome: NAME|accepted|WORDS or NAME|refused|WORDS (words of the message).
expect() {
  local target="$1" kind="$2"
  shift 2
  while IFS='|' read -r name outcome words; do
    [[ -z "$name" ]] && continue
    local out
    out="$(FUZZ_PRINT_OUTCOME=1 "$build/fuzz/oomflight_fuzz_$target" "$here/corpus/$kind/$name" 2>&1)" ||
      { echo "fuzz: $kind/$name: the target failed" >&2; echo "$out" | tail -40 >&2; failed=1; continue; }
    local line
    line="$(grep -m1 '^outcome: ' <<<"$out" || true)"
    if [[ "$line" != "outcome: $outcome: "* || "$line" != *"$words"* ]]; then
      echo "fuzz: $kind/$name: expected $outcome with '$words', got '${line:-no outcome}'" >&2
      failed=1
    else
      echo "fuzz: $kind/$name: ${line#outcome: }" | cut -c1-160
    fi
  done
}

expect pickle pickle <<'CASES'
snapshot-protocol4|accepted|1 segments, 9 trace entries, 2 stacks
snapshot-protocol2|accepted|1 segments, 9 trace entries, 2 stacks
snapshot-truncated|refused|a length of
cycle-self|refused|a container added to itself
cycle-dict|refused|a container added to itself
cycle-ancestor|refused|a container added to one of its own ancestors
memo-bomb|refused|device_traces[0]: decodes to more segments, blocks and trace entries than the pickle holds values
code-global|refused|opcode GLOBAL
torch-save-zip|refused|a zip archive (torch.save's format)
gzip|refused|a gzip file
protocol0|refused|a protocol 0 or 1 pickle
deep|refused|nesting deeper than 1000 levels
CASES

expect archive archive <<'CASES'
valid|accepted|4 ranks, 146 events
valid-v01-no-mark|accepted|4 ranks, 146 events
times-at-int64-ends|accepted|4 ranks, 146 events
sizes-above-2-63|accepted|4 ranks, 146 events
batches-rank-unknown|refused|/batches row 0: rank 9 is not in /ranks
batches-not-grouped|refused|/batches row 2: rank 0 is not in /ranks, or its rows are not grouped
context-string-of-another-rank|refused|/context row 0: key
no-complete-mark|refused|incomplete archive: the dump that wrote it did not finish
complete-zero|refused|incomplete archive: root attribute 'complete' is not 1
event-offset-wraps|refused|event_offset 18446744073709551615 + event_count 2 lie outside /events
string-offset-wraps|refused|string_offset 18446744073709551608 + string_count 16 lie outside /strings
rank-outside-world|refused|rank 7 is outside 0 .. world_size - 1
duplicate-rank|refused|/ranks: rank 0 appears twice
origins-outside|refused|'origin_ranks' names rank 7, outside 0 .. 3
world-zero|refused|'world_size' is 0
newer-schema|refused|written with archive schema 99
no-ranks|refused|/ranks has no rows
stack-id-outside|refused|stack_id 1000 is outside /stacks
frame-outside|refused|frame 4000000000 is outside /frames
string-outside|refused|/strings row 0: offset 9223372036854775808 + length 10 lie outside /string_data
collective-op-outside|refused|/collectives row 4: op 200
collectives-not-grouped|refused|/collectives row 8: rank 0 is not in /ranks, or its rows are not grouped
communicator-rank-outside|refused|/communicators row 3: rank 4 of size 4 is out of range
collectives-distinct-communicators|accepted|4 ranks, 146 events
collectives-orphan-ends|accepted|4 ranks, 146 events
collective-times-at-int64-min|accepted|4 ranks, 146 events
CASES

# Every corpus file must have an expectation above: a new hostile case is checked, not just run.
for kind in pickle archive; do
  for f in "$here/corpus/$kind"/*; do
    grep -q "^$(basename "$f")|" "$0" || { echo "fuzz: $kind/$(basename "$f") has no expected outcome in $0" >&2; failed=1; }
  done
done

# Then fuzz, from a copy of the corpus (new inputs go to the copy, never into the checkout).
for target in pickle archive; do
  mkdir -p "$work/$target" "$work/artifacts-$target"
  cp "$here/corpus/$target"/* "$work/$target/"
  if ! "$build/fuzz/oomflight_fuzz_$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20 \
       -print_final_stats=1 -artifact_prefix="$work/artifacts-$target/" "$work/$target" >"$work/$target.log" 2>&1; then
    echo "fuzz: $target: a finding; the input that caused it:" >&2
    ls -la "$work/artifacts-$target" >&2
    for a in "$work/artifacts-$target"/*; do base64 -w 0 "$a" >&2; echo >&2; done
    tail -60 "$work/$target.log" >&2
    failed=1
  else
    echo "fuzz: $target: $(grep -m1 'stat::number_of_executed_units' "$work/$target.log") in ${seconds} s, no finding"
  fi
done
exit "$failed"
