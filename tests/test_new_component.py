""" "A new attention is one file + one YAML" — and the same for a selector and a task — proven from outside the repo.

A throwaway attention, selector and task are written into a temp dir (Python files found through
`$LRA_BENCH_PLUGINS`, YAML options through `hydra.searchpath`), and `run.py` trains with them: nothing in the
repository is edited, no registry list, recipe, leaderboard table or test tuple needs an entry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TINY_LISTOPS, run_cli

ATTENTION = '''
from dataclasses import dataclass

import torch

from models.attention.base import Attention


@dataclass
class ScaledDotConfig:
    name: str = "scaled_dot"
    temperature: float = 1.0


class ScaledDotAttention(Attention):
    """Exact softmax attention at a temperature (a throwaway test component)."""

    config = ScaledDotConfig

    def configure(self, cfg: ScaledDotConfig) -> None:
        self.temperature = cfg.temperature

    def forward(self, q, k, v, mask):
        keep = None if mask is None else mask[:, None, None, :]
        return torch.nn.functional.scaled_dot_product_attention(q / self.temperature, k, v, attn_mask=keep)
'''

SELECTOR = '''
from dataclasses import dataclass

import torch

from models.landmarks.base import LandmarkSelector
from models.landmarks.uniform import token_landmarks


@dataclass
class FirstTokensConfig:
    name: str = "first_tokens"


class FirstTokensSelector(LandmarkSelector):
    """The first m positions as landmarks (a throwaway test component)."""

    config = FirstTokensConfig
    token_landmarks = True

    def select(self, q, k, mask, m):
        b, h, n, _ = q.shape
        idx = torch.arange(m, device=q.device).expand(b, h, m)
        return token_landmarks(q, k, idx, mask.expand(b, h, n)[..., :m])
'''

TASK = '''
from dataclasses import dataclass

import numpy as np

from tasks.base import LRADataModule


@dataclass
class ParityConfig:
    name: str = "parity"
    seq_len: int = 32
    max_length: int = 32
    vocab_size: int = 3
    num_classes: int = 2
    dual: bool = False
    size: int = 64


class ParityDataModule(LRADataModule):
    """Bits → their parity (a throwaway test task, generated in memory)."""

    name = "parity"
    config = ParityConfig
    tokenizer_version = "bits-1"

    def build_split(self, split):
        rng = np.random.default_rng({"train": 0, "val": 1, "test": 2}[split])
        n, length = int(self.cfg["size"]), int(self.cfg["seq_len"])
        bits = rng.integers(0, 2, (n, length))
        return {"input_ids": (bits + 1).astype(np.int16), "length": np.full(n, length, np.int32),
                "label": bits.sum(1) % 2}
'''

YAML = {
    "attn/scaled_dot.yaml": "name: scaled_dot\ntemperature: 2.0\n",
    "selector/first_tokens.yaml": "name: first_tokens\n",
    "task/parity.yaml": "name: parity\nseq_len: 32\nmax_length: 32\nvocab_size: 3\nnum_classes: 2\n"
    "dual: false\nsize: 64\n",
}


def write_plugins(root: Path) -> tuple[Path, Path]:
    plugins, conf = root / "plugins", root / "conf"
    plugins.mkdir(parents=True)
    for name, text in (("scaled_dot", ATTENTION), ("first_tokens", SELECTOR), ("parity", TASK)):
        (plugins / f"{name}.py").write_text(text)
    for rel, text in YAML.items():
        (conf / rel).parent.mkdir(parents=True, exist_ok=True)
        (conf / rel).write_text(text)
    return plugins, conf


@pytest.mark.slow
def test_a_component_is_one_file_plus_one_yaml(tmp_path: Path) -> None:
    plugins, conf = write_plugins(tmp_path / "mine")
    env = {"LRA_BENCH_PLUGINS": str(plugins)}
    common = [*TINY_LISTOPS, f"hydra.searchpath=[file://{conf}]"]
    runs = {
        "attention": ["attn=scaled_dot"],
        "selector": ["attn=nystrom", "selector=first_tokens", "attn.num_landmarks=4"],
        "task": ["task=parity", "attn=full"],
    }
    for kind, extra in runs.items():
        overrides = [o for o in common if not (kind == "task" and o.startswith("task."))] + extra
        run_cli([*overrides, f"run_name={kind}"], tmp_path, env=env)
        (record_path,) = (tmp_path / "outputs").glob(f"*/*/{kind}/results.json")
        record = json.loads(record_path.read_text())
        assert record["status"] == "completed", (kind, record["error"])
        assert record["metrics"]["test_acc"] is not None
        if kind == "attention":
            assert record["attn"] == "scaled_dot" and record["config"]["attn"]["temperature"] == 2.0
        if kind == "selector":
            assert record["selector"] == "first_tokens"
        if kind == "task":
            assert record["task"] == "parity" and record["data"]["seq_len"] == 32
