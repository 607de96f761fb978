"""The harness's shared error types, in a leaf module that imports nothing of the project.

Why a leaf: `ConfigError` is raised by some twenty modules (config checks, run-dir state, checkpoints, the lock,
the CLIs). While it lived in `lra_bench.config.validate`, every raiser depended on the validator, and the validator
(which checks checkpoints and paths) on them: an import cycle. Here anyone may raise it.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration mistake; its message is the whole story (no traceback needed)."""


class IncompatibleCombination(ConfigError):
    """Two choices that each exist but cannot go together (a selector on an attention that takes none, cluster-mean
    landmarks for an attention that needs token landmarks): in a sweep's cross product such a job is skipped with
    one line (`hydra_plugins.lra_bench_sweeper`), not launched to fail."""
