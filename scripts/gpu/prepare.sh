#!/usr/bin/env bash
# Download, on a machine with registry access, the wheels the GPU node lacks (scripts/gpu/wheels.txt) for
# CPython 3.12 ($PYTHON_VERSION) on manylinux x86-64 into the git-ignored .whl/ (or $1). Pure-Python wheels serve any platform; a
# package published only as an sdist is built into a pure-Python wheel here. Idempotent: a wheel already there is
# kept. Prints the wheel list and its total size (the node's transfer limit is 64 MiB with the source tree).
#   scripts/gpu/prepare.sh            # → .whl/
#   PYTHON=.venv/bin/python scripts/gpu/prepare.sh /tmp/wheels
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.whl}
PY=${PYTHON:-python3}
PYVER=${PYTHON_VERSION:-3.12}  # the node's Python
LIST=scripts/gpu/wheels.txt
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
mkdir -p "$DEST"
args=(--no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp --abi "cp${PYVER/./}" --abi abi3 --abi none)
for p in "${PLATFORMS[@]}"; do args+=(--platform "$p"); done
while read -r spec _module how; do
  case "$spec" in "" | \#*) continue ;; esac
  name=${spec%%==*}
  glob=$(echo "$name" | tr '-' '_')
  if compgen -G "$DEST/${glob}-${spec##*==}-*.whl" >/dev/null; then
    echo "have     $spec"
  elif [ "${how:-}" = "sdist" ]; then
    echo "build    $spec (no wheel on the registry: a pure-Python wheel from the sdist)"
    "$PY" -m pip wheel -q --no-deps -w "$DEST" "$spec"
  else
    echo "download $spec"
    "$PY" -m pip download -q "${args[@]}" -d "$DEST" "$spec"
  fi
done <"$LIST"
echo
echo "wheels in $DEST:"
ls -l "$DEST"/*.whl | awk '{printf "  %8.1f KiB  %s\n", $5 / 1024, $NF}'
du -cb "$DEST"/*.whl | tail -1 | awk '{printf "total: %.2f MiB\n", $1 / 1048576}'
