#!/usr/bin/env bash
# Installs the build into an empty prefix and uses the package the way outside projects do.
#   run.sh BUILD_DIR CONSUMERS_DIR VERSION CMAKE CC CXX GENERATOR MAKE_PROGRAM
# Checks: the installed tree (library, faces-only headers, the command, the CMake package with its version file,
# oomflight.pc); `oomflight --version`; every installed header compiles alone and opens no MPI, HDF5, spdlog or fmt
# header; a C consumer built with pkg-config and a C++ consumer built with find_package (neither with MPI, spdlog
# or fmt on its include path) record events, dump, and the archives hold what they recorded.
set -euo pipefail
build=$1 consumers=$2 version=$3 cmake=$4 cc=$5 cxx=$6 generator=$7 make_program=$8
work=$(mktemp -d "${TMPDIR:-/tmp}/oomflight-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }
foreign='mpi\.h|/openmpi/|hdf5|spdlog|/fmt/|fmt/core'

prefix=$work/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log"
cd "$prefix"
lib=$(find . -name liboomflight.so | head -1)
lib=${lib#./}
[ -n "$lib" ] || fail "no liboomflight.so under the prefix"
libdir=$prefix/$(dirname "$lib")
for f in bin/oomflight include/oomflight/oomflight.h include/oomflight/version.h include/oomflight/api.h \
         include/oomflight/record/recorder.hpp include/oomflight/format/archive_reader.hpp \
         include/oomflight/analysis/post_mortem.hpp include/oomflight/export/text_report.hpp; do
  [ -f "$f" ] || fail "$f is not installed"
done
for f in oomflightConfig.cmake oomflightConfigVersion.cmake oomflightTargets.cmake; do
  [ -f "$libdir/cmake/oomflight/$f" ] || fail "$libdir/cmake/oomflight/$f is not installed"
done
[ -f "$libdir/pkgconfig/oomflight.pc" ] || fail "oomflight.pc is not installed"
internal=$(find include \( -name 'session.hpp' -o -name 'log.hpp' -o -name 'collective_writer.hpp' -o -name 'mpi_job.hpp' \
                           -o -name 'dump_executor.hpp' -o -name 'trigger_protocol.hpp' -o -name 'h5_*.hpp' \))
[ -z "$internal" ] || fail "internal headers are installed: $internal"
echo "installed: $(find . -type f | wc -l) files, $(find include -type f | wc -l) headers"

# The library exports its faces only: the C API and the OOMFLIGHT_API C++ faces, never the control plane's
# internals, spdlog, fmt, MPI or HDF5 (a library loaded into a foreign process must not clash with the host's).
exports=$(nm -D --defined-only "$prefix/$lib" | c++filt)
if grep -E "oomflight::(Session|TriggerProtocol|DumpExecutor|log|set_log|identify|write_archive_collective)|spdlog::logger::|fmt::v[0-9]+::|MPI_|H5[A-Z]" <<<"$exports"; then
  fail "liboomflight exports internal or foreign symbols (above)"
fi
c_api=$(grep -cE " T oomflight_" <<<"$exports")
[ "$c_api" -ge 16 ] || fail "only $c_api C API functions are exported"
echo "exports: $c_api C API functions, no internals"

# The command, from the prefix alone.
got=$("$prefix/bin/oomflight" --version)
[ "$got" = "oomflight $version" ] || fail "oomflight --version printed '$got', expected 'oomflight $version'"
echo "bin/oomflight --version: $got"

# The NCCL profiler plugin, when it was built: next to the library, finding it there alone ($ORIGIN), and named by
# the installed `oomflight run`.
if [ -e "$libdir/libnccl-profiler-oomflight.so" ]; then
  # ldd's output is read whole before grep: `ldd | grep -q` under pipefail failed 1 run in several (CI), when grep
  # exited at its match and ldd died of SIGPIPE writing the rest.
  deps=$(env -u LD_LIBRARY_PATH ldd "$libdir/libnccl-profiler-oomflight.so")
  grep -q "liboomflight.so.* => $libdir/" <<<"$deps" ||
    fail "the NCCL profiler plugin does not find the liboomflight beside it: $deps"
  got=$(env -u NCCL_PROFILER_PLUGIN "$prefix/bin/oomflight" run -- sh -c 'printf %s "$NCCL_PROFILER_PLUGIN"')
  [ "$(readlink -f "$got")" = "$(readlink -f "$libdir/libnccl-profiler-oomflight.so")" ] || fail "oomflight run set NCCL_PROFILER_PLUGIN to '$got'"
  echo "NCCL profiler plugin: installed beside the library, named by oomflight run"
fi

# Every installed header compiles alone against the prefix, and none opens a dependency's header.
while IFS= read -r header; do
  if [[ $header == *.h ]]; then
    "$cc" -std=c11 -fsyntax-only -H -I"$prefix/include" -x c "$header" 2>"$work/h.log" || { cat "$work/h.log"; fail "$header does not compile as C alone"; }
  fi
  "$cxx" -std=c++20 -fsyntax-only -H -I"$prefix/include" -x c++ "$header" 2>"$work/h.log" || { cat "$work/h.log"; fail "$header does not compile as C++ alone"; }
  if grep -E "$foreign" "$work/h.log"; then fail "$header opens the headers above"; fi
done < <(find "$prefix/include" -type f)
echo "headers: each compiles alone; none opens MPI, HDF5, spdlog or fmt"

# A C consumer through pkg-config.
export PKG_CONFIG_PATH=$libdir/pkgconfig
flags=$(pkg-config --cflags --libs oomflight)
[ "$(pkg-config --modversion oomflight)" = "$version" ] || fail "pkg-config --modversion is not $version"
if grep -Eq "$foreign" <<<"$flags"; then fail "pkg-config flags name a private dependency: $flags"; fi
# shellcheck disable=SC2086
# The README's line: the rpath comes from the .pc file's libdir (relocatable: it resolves under this prefix).
pc_libdir=$(pkg-config --variable=libdir oomflight)
[ "$(realpath "$pc_libdir")" = "$(realpath "$libdir")" ] || fail "pkg-config libdir $pc_libdir is not $libdir"
"$cc" -std=c11 -Wall -Wextra -Werror "$consumers/c_consumer.c" $flags -Wl,-rpath,"$pc_libdir" -o "$work/c_consumer"
mkdir "$work/c-run" && cd "$work/c-run"
OOMFLIGHT_RUN_NAME=c-consumer OOMFLIGHT_FOLDER=out "$work/c_consumer"
[ -f out/oom.3.h5 ] || fail "the C consumer wrote no out/oom.3.h5"
"$prefix/bin/oomflight" report out/oom.3.h5 >"$work/report.txt"
grep -q "rank 0 at batch 3: requested 1.00 GiB, device free 512.00 MiB of 16.00 GiB" "$work/report.txt" ||
  { cat "$work/report.txt"; fail "the report of the C consumer's archive"; }
grep -Eq "^ +0 +3 .* 105 +0 +<- out of memory$" "$work/report.txt" ||
  { cat "$work/report.txt"; fail "the C consumer's 105 events (4 steps, 100 allocs, the oom)"; }
echo "C consumer (pkg-config: $flags): archive read back"

# A C++ consumer through find_package.
"$cmake" -S "$consumers/cxx_consumer" -B "$work/cxx-build" -G "$generator" -DCMAKE_MAKE_PROGRAM="$make_program" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$work/cxx-configure.log" ||
  { cat "$work/cxx-configure.log"; fail "find_package(oomflight) in a fresh project"; }
"$cmake" --build "$work/cxx-build" >"$work/cxx-build.log" || { cat "$work/cxx-build.log"; fail "building the C++ consumer"; }
if grep -E "$foreign" "$work/cxx-build/compile_commands.json"; then fail "the C++ consumer's compile line names a private dependency"; fi
mkdir "$work/cxx-run" && cd "$work/cxx-run"
OOMFLIGHT_RUN_NAME=cxx-consumer "$work/cxx-build/cxx_consumer"
echo "C++ consumer (find_package): archive read back"
