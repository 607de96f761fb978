"""One run: `entry.run_stage` (validate → lock → one stage), the stages `train` (data → model → start checks → fit
→ test → record), `evaluation` (test one checkpoint) and `spt` (the plan of pretrain then fine-tune), the record's
writer (`recorder`), the LightningModule, the callbacks (efficiency, checkpointing, requeue, identity stamp, test
outputs), loggers and the console output."""
