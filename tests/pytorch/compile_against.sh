#!/usr/bin/env bash
# Compiles the torch extension (plugins/pytorch/oomflight_torch.cpp) against an unpacked torch wheel's headers
# (torch 2.4.1, the oldest torch the extension claims: scripts/python_envs.sh unpacks it), as torch's own
# extension build would for that wheel (its pre-C++11 string ABI, TORCH_EXTENSION_NAME, the Python and CUDA
# headers), with warnings as errors. A syntax and type check: the wheel is not installed, so nothing is linked.
set -euo pipefail
compiler=$1 torch_root=$2 plugin=$3
if [[ -z $torch_root || ! -d $torch_root/include ]]; then
  echo "no unpacked torch wheel at '$torch_root': run scripts/bootstrap.sh (scripts/python_envs.sh unpacks it)" >&2
  exit 1
fi
version=$(sed -n "s/^__version__ = '\(.*\)'$/\1/p" "$torch_root/version.py")
python_include=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
cuda_include=${CUDA_HOME:-/usr/local/cuda}/include
echo "compiling $plugin/oomflight_torch.cpp against torch $version's headers"
"$compiler" -fsyntax-only -std=c++17 -Wall -Wextra -Werror -Wno-unused-parameter -D_GLIBCXX_USE_CXX11_ABI=0 \
    -DTORCH_EXTENSION_NAME=oomflight_torch -DTORCH_API_INCLUDE_EXTENSION_H \
    -I "$plugin" -isystem "$torch_root/include" -isystem "$torch_root/include/torch/csrc/api/include" \
    -isystem "$python_include" -isystem "$cuda_include" "$plugin/oomflight_torch.cpp"
echo "torch $version: compiles"
