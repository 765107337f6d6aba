#!/usr/bin/env bash
# Makes, once per machine, the Python environments the real-torch tests run in, and prints the CMake arguments
# that point the build at them (scripts/bootstrap.sh passes them to cmake):
#
#   torch     python/requirements/torch.txt: torch 2.11.0 (what the GPU machines hold), Lightning, h5py
#   composer  python/requirements/composer.txt: Composer's newest release with the torch it pins (2.7.0)
#   torch 2.4 headers, from the wheel (not installed): the oldest torch the extension claims, compiled against
#
# The torch wheels pull about 3 GB of CUDA libraries each, so the environments live outside the clone, in
# ${XDG_CACHE_HOME:-~/.cache}/oomflight, named by a hash of their requirements file and the interpreter: a fresh
# clone with the same pins reuses them, a changed pin makes a new one. An environment counts only once its
# `.complete` marker is written (an interrupted install is made again), and a lock keeps two bootstraps apart.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

python=/usr/bin/python3   # Debian's: the interpreter whose headers (python3-dev) the extension builds against
cache=${XDG_CACHE_HOME:-$HOME/.cache}/oomflight
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

key_of() { cat "$@" <("$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-12; }

make_env() {  # name requirements-file -> prints the environment's folder
  local name=$1 requirements=$2 dir
  dir=$cache/venv-$name-$(key_of "$requirements")
  if [[ ! -f $dir/.complete ]]; then
    echo "python_envs: making $dir from $requirements (about 3 GB the first time)" >&2
    rm -rf "$dir"
    "$python" -m venv "$dir"
    "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2
    touch "$dir/.complete"
  fi
  echo "$dir"
}

torch_headers() {  # version -> prints the folder holding that torch wheel's include/
  local version=$1 dir tmp
  dir=$cache/torch-$version-headers-$(key_of /dev/null)
  if [[ ! -f $dir/.complete ]]; then
    echo "python_envs: unpacking torch $version's headers into $dir" >&2
    rm -rf "$dir"
    tmp=$(mktemp -d)
    "$torch_env/bin/pip" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        -d "$tmp" "torch==$version" >&2
    "$python" - "$tmp"/torch-*.whl "$dir" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extractall(out, [n for n in z.namelist() if n.startswith("torch/include/") or n == "torch/version.py"])
PY
    rm -rf "$tmp"
    touch "$dir/.complete"
  fi
  echo "$dir/torch"
}

torch_env=$(make_env torch python/requirements/torch.txt)
composer_env=$(make_env composer python/requirements/composer.txt)
torch24=$(torch_headers 2.4.1)
echo "-DOOMFLIGHT_TORCH_PYTHON=$torch_env/bin/python"
echo "-DOOMFLIGHT_COMPOSER_PYTHON=$composer_env/bin/python"
echo "-DOOMFLIGHT_TORCH24_ROOT=$torch24"
