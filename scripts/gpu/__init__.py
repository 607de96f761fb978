"""The GPU node check: scripts/gpu/prepare.sh (wheels), scripts/gpu/check.sh (the check), report.py (its report)."""
