"""One run: `train` (validate → data → model → fit → test → record), the LightningModule, the callbacks
(efficiency, checkpointing, requeue), loggers and the console output."""
