"""Fine-tuning from a self-pretraining run (`pretrained=<run dir or .ckpt>`): load its encoder.

What carries over is the encoder — token and position embeddings (the mask token's row included), every block
(selector state such as GPA's codebook is a buffer inside its block, so it comes along), the final norm. The task
head is the fresh one the network was built with, and the optimiser, schedule and step count start anew, as in
IdoAmos/not-from-scratch@f919137 (`train.py::load_pretrained_model`: every weight but the decoder, then a new run).
Unlike theirs (`strict=False`, then a tolerance check), loading here is strict: the encoder's tensors are copied
exactly, or the run stops with one line.

Which run and checkpoint `pretrained=` names, and the checks on it, come first, before anything is built
(`lra_bench.config.pretrained_run`); this module loads the encoder from it.
"""

from __future__ import annotations

from lra_bench.config.pretrained_run import PretrainedSource
from lra_bench.errors import ConfigError
from lra_bench.record.checkpoint_file import load_checkpoint
from models.heads import TaskNetwork

ENCODER_PREFIX = "model.encoder."  # the encoder's keys in a LightningModule's state_dict (`self.model.encoder`)


def load_encoder(network: TaskNetwork, source: PretrainedSource) -> int:
    """Copy the pretrained encoder into `network.encoder` exactly (strict); return the number of tensors copied."""
    checkpoint = load_checkpoint(source.checkpoint)
    if "spt_stage" not in checkpoint:
        raise ConfigError(f"pretrained={source.value}: {source.checkpoint} is not a self-pretraining checkpoint")
    state = checkpoint["state_dict"]
    encoder = {k[len(ENCODER_PREFIX) :]: v for k, v in state.items() if k.startswith(ENCODER_PREFIX)}
    try:
        network.encoder.load_state_dict(encoder, strict=True)
    except RuntimeError as err:
        first = " ".join(str(err).split())[:300]
        raise ConfigError(f"pretrained={source.value}: its encoder tensors do not fit this network ({first})") from None
    return len(encoder)
