#!/usr/bin/env bash
# A machine without oomflight's development packages: CMake (what `pip install ./python` and the CMake build both
# run) must stop with ONE error that names everything missing and the Debian packages to install, not the first
# of several "Could not find a package" errors. Each package is hidden with CMAKE_DISABLE_FIND_PACKAGE_<Name>, the
# way a machine without it looks to find_package. Usage: missing_packages.sh SOURCE_DIR CMAKE GENERATOR
set -uo pipefail
source_dir=$1 cmake=$2 generator=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "missing_packages.sh: $*"; echo "--- CMake's output:"; echo "$out"; exit 1; }

configure() {  # NAME... -> CMake's output in $out, its status in $rc
  local hide=() name
  for name in "$@"; do hide+=("-DCMAKE_DISABLE_FIND_PACKAGE_$name=ON"); done
  rm -rf "$work/build"
  out=$("$cmake" -S "$source_dir" -B "$work/build" -G "$generator" -DOOMFLIGHT_BUILD_TESTS=OFF \
        -DOOMFLIGHT_BUILD_EXAMPLES=OFF -DOOMFLIGHT_BUILD_BENCH=OFF "${hide[@]}" 2>&1)
  rc=$?
}

configure MPI HDF5 fmt spdlog CLI11 nlohmann_json
[[ $rc != 0 ]] || fail "the configuration succeeded with every dependency hidden"
[[ $(grep -c "CMake Error" <<<"$out") == 1 ]] || fail "not exactly one CMake error"
flat=$(tr -s ' \n' ' ' <<<"$out")
for package in libopenmpi-dev openmpi-bin libhdf5-openmpi-dev libfmt-dev libspdlog-dev libcli11-dev \
               nlohmann-json3-dev; do
  [[ $flat == *"apt-get install"*"$package"* ]] || fail "the error does not name $package"
done

configure CLI11
[[ $rc != 0 ]] || fail "the configuration succeeded without CLI11"
flat=$(tr -s ' \n' ' ' <<<"$out")
[[ $flat == *"missing CLI11. On Debian or Ubuntu: apt-get install libcli11-dev."* ]] ||
  fail "one missing package is not named alone"
echo "missing_packages.sh: one error naming every missing package and its Debian package"
