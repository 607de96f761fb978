"""How well an attention's implied operator approximates exact softmax attention: the metrics (`metrics`, pure
fp64 functions shared with the approximation study) and the validation-time callback (`callback`).

`LOCALITY_WINDOWS` lives here, importable without torch, because the leaderboard names its columns after it."""

#: the windows (tokens on each side) whose share of attention mass the diagnostics report: `mass_within_<w>`
LOCALITY_WINDOWS = (16, 64, 256)
#: the per-head locality values (`metrics.locality`), each also for the exact softmax with the suffix `_exact`
LOCALITY_KEYS = ("attn_distance", *(f"mass_within_{w}" for w in LOCALITY_WINDOWS))
