#!/usr/bin/env bash
# From a fresh Debian 12 machine (as root) to a built tree, then the demo. Safe to run again: packages are
# installed only when missing, and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config openmpi-bin libopenmpi-dev libhdf5-openmpi-dev hdf5-tools
          libspdlog-dev libfmt-dev libcli11-dev libgtest-dev libbenchmark-dev python3-h5py
          python3-pip python3-setuptools python3-wheel clang libclang-rt-14-dev
          nlohmann-json3-dev chromium python3-dev python3-venv slurmctld slurmd slurm-client munge ccache)
missing=()
for p in "${packages[@]}"; do
  [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The real-torch test environments (torch 2.11.0 with Lightning; Composer with its torch; torch 2.4's headers):
# made once per machine outside the clone, reused by every clone with the same pins (scripts/python_envs.sh).
mapfile -t torch_envs < <(scripts/python_envs.sh)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${torch_envs[@]}"
cmake --build build -j "$(nproc)"
# A one-node Slurm cluster, so that the tests also start jobs with srun, as most clusters do (scripts/slurm/start.sh).
scripts/slurm/start.sh
scripts/demo.sh
