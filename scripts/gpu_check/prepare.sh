#!/usr/bin/env bash
# Gathers what the GPU machine lacks for oomflight's GPU check (docs/pytorch.md, "The GPU check") into one folder:
# the built CLI and liboomflight, the shared libraries they and Open MPI need that a stock Ubuntu image with
# PyTorch does not have (parallel HDF5, Open MPI and their dependencies; never the C and C++ runtimes, which the
# target has in newer versions), and Open MPI's launcher, components and data files, relocatable through
# OPAL_PREFIX. The package and the extension's sources travel with the checkout. Usage:
#   scripts/gpu_check/prepare.sh [BUILD_DIR=build] [DEST=gpu-check]
# DEST is ignored by git; carry it to the GPU machine (device run, carry ["gpu-check"]) and run
# scripts/gpu_check/run.sh there. Exits non-zero, naming it, when a library cannot be found.
set -euo pipefail
build=${1:-build}
dest=${2:-gpu-check}
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
ompi_lib=/usr/lib/$multiarch/openmpi/lib
for need in "$build/bin/oomflight" "$build/core/liboomflight.so" /usr/bin/orterun "$ompi_lib/openmpi3"; do
  [[ -e $need ]] || { echo "prepare.sh: $need is missing (build first; Open MPI from Debian's openmpi-bin)" >&2; exit 1; }
done
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/usr/bin" "$dest/usr/lib/$multiarch/openmpi/lib" "$dest/usr/share" "$dest/etc"
# Without debug information (30 MB of it in a RelWithDebInfo build; the device takes 64 MiB in all).
soname=$(objdump -p "$build/core/liboomflight.so" | awk '/SONAME/ {print $2}')
strip --strip-debug -o "$dest/bin/oomflight" "$build/bin/oomflight"
strip --strip-debug -o "$dest/lib/$soname" "$build/core/liboomflight.so"
[[ $soname == liboomflight.so ]] || ln -s "$soname" "$dest/lib/liboomflight.so"
# The NCCL profiler plugin, when it is built: next to the library, which it finds through $ORIGIN (nccl_check.py).
plugin="$build/core/libnccl-profiler-oomflight.so"
[[ ! -e $plugin ]] || strip --strip-debug -o "$dest/lib/libnccl-profiler-oomflight.so" "$plugin"
# The launcher under its Debian layout, so that OPAL_PREFIX=$dest/usr relocates it.
cp -L /usr/bin/orterun "$dest/usr/bin/orterun"
ln -s orterun "$dest/usr/bin/mpirun"
[[ -e /usr/bin/orted ]] && cp -L /usr/bin/orted "$dest/usr/bin/orted"
cp -rL "$ompi_lib/openmpi3" "$dest/usr/lib/$multiarch/openmpi/lib/"
cp -rL /usr/share/openmpi "$dest/usr/share/"
cp -rL /etc/openmpi "$dest/etc/"
# Every shared library these need, but the C and C++ runtimes (the GPU image's are newer) and the dynamic loader.
base='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s|ld-linux-x86-64|linux-vdso)\.so'
missing=0
while read -r elf; do
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    if [[ $path == "not" ]]; then
      # An optional Open MPI component whose own dependency this machine lacks is skipped by Open MPI too.
      [[ $elf == */openmpi3/* ]] || { echo "prepare.sh: $elf needs $name, which is not installed" >&2; missing=1; }
      continue
    fi
    [[ $name =~ $base ]] && continue
    [[ -e "$dest/lib/$name" ]] || cp -L "$path" "$dest/lib/$name"
  done < <(ldd "$elf" 2>/dev/null)
done < <(find "$dest/bin" "$dest/lib" "$dest/usr/bin" "$dest/usr/lib" -type f \( -name '*.so*' -o -perm -u+x \))
[[ $missing == 0 ]] || exit 1
# Lightning for the check's Lightning case (the GPU machine's image has torch, not Lightning; no network there), and
# scikit-build-core with what it imports for run.sh's install of the extension: the pure-Python packages of the
# real-torch test environment (scripts/python_envs.sh), when it is made.
torch_python=$(ls -d "${XDG_CACHE_HOME:-$HOME/.cache}"/oomflight/venv-torch-*/bin/python 2>/dev/null | head -1)
if [[ -n $torch_python && -x $torch_python ]]; then
  site=$("$torch_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$dest/python"
  for package in pytorch_lightning lightning_utilities torchmetrics scikit_build_core pathspec packaging; do
    if [[ -d "$site/$package" ]]; then cp -r "$site/$package" "$dest/python/"; fi
  done
  find "$dest/python" -name __pycache__ -prune -exec rm -rf {} +
fi
cat > "$dest/env.sh" <<'ENV'
# Source this on the GPU machine: oomflight's CLI and library, Open MPI relocated to this folder.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$here/bin:$here/usr/bin:$PATH"
export LD_LIBRARY_PATH="$here/lib:$here/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OOMFLIGHT_LIBRARY="$here/lib/liboomflight.so"
export OPAL_PREFIX="$here/usr" OPAL_SYSCONFDIR="$here/etc/openmpi"
export OPAL_LIBDIR="$here/usr/lib/x86_64-linux-gnu/openmpi/lib" OPAL_PKGDATADIR="$here/usr/share/openmpi"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ENV
du -sk "$dest" | awk -v d="$dest" '{printf "prepare.sh: %s holds %.1f MiB\n", d, $1 / 1024}'
