#!/usr/bin/env bash
# The GPU node check in one command (≤ 9 min on one H200), or the same stages shrunk on a CPU (--tiny):
#   scripts/gpu/check.sh --out DIR [--tiny] [--work DIR] [--wheels DIR] [--budget SECONDS] [--stage-budget STAGE=S]
# Everything it writes for people lands under --out (report.md, report.json, check.log, stages.log, the bench
# JSON, listops_curves.csv): at most 8 files. The stages and their budgets: scripts/gpu/plan.py. Runs from the
# source tree (no pip install of the repo: the node is offline); the wheels in .whl/ (scripts/gpu/prepare.sh)
# supply what the node's Python lacks. $PYTHON picks the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=""
prev=""
for arg in "$@"; do
  [ "$prev" = "--out" ] && out=$arg
  case "$arg" in --out=*) out=${arg#--out=} ;; esac
  prev=$arg
done
if [ -z "$out" ]; then
  echo "error: --out DIR is required (the folder the report is written to)" >&2
  exit 2
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$out/check.log") 2>&1
tee_pid=$!
echo "scripts/gpu/check.sh $* — $(date -u +%FT%TZ) on $(hostname), $(nproc) cores"
"${PYTHON:-python3}" -m scripts.gpu.check "$@"
status=$?
echo "check.sh: exit $status"
exec 1>&- 2>&-
wait "$tee_pid" 2>/dev/null  # check.log is complete when we return
exit $status
