"""One run: `train` (validate → data → model → start checks → fit → test → record), `evaluation` (test one
checkpoint), the LightningModule, the callbacks (efficiency, checkpointing, requeue, identity stamp, test outputs),
loggers and the console output."""
