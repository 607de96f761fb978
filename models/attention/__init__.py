"""Attention operators (the `attn` axis): one module per variant, each a subclass of `Attention` that sets its own
`name` and `config`. The harness discovers them (`lra_bench.registry`): a new attention is one file here, and
`make configs` writes its YAML in conf/attn/ from its config dataclass."""

from models.attention.base import Attention

__all__ = ["Attention"]
