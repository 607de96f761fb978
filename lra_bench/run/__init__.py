"""One run, a file per concern (the order a run meets them):

entry        the way in: settle the config, lock the run dir, run one stage
rundir       the run dir: its lock, the experiment it holds (identity.json), the `latest` link
build        config → data module, network, LightningModule, the Trainer's arguments, the user's callbacks
module       the LightningModule (loss, accuracy, AdamW with warm-up + decay)
train        the training stage: schedule and identity checks, fit, test on the best-val checkpoint, record
checkpoints  what is saved when, atomic writes, which file a resume picks, requeue, the checkpoint's identity
signals      SIGTERM / Ctrl-C: finish the step, save, exit 143 / 130
metrics      step time, memory (the efficiency callback) and the loggers (CSV, W&B)
recorder     the per-example test outputs and the one writer of `results.json`
terminal     run.log, what the terminal shows, progress bars and status lines
console      the config tree at start, the opening line and the summary at the end
evaluation   the stage that tests one checkpoint (`train=false`)
pretrain     the self-pretraining stage, `stage=spt` (pretrain, then fine-tune), a fine-tune's pretrained encoder
"""
