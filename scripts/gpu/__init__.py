"""The GPU node check: scripts/gpu/prepare.sh (wheels) and scripts/gpu/check.sh (the check)."""
