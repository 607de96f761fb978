"""The config tree's Python side, below the run: composing it (`compose`), Hydra setup (`setup`: the resolvers,
`tuned` among them), the checks of a composed config (`validate`), the stage keys a run derives (`stages`, from a
fine-tune's pretrained run: `pretrained_run`) and the protocol check that derives them the same way (`conformance`).
It reads records and checkpoint files (`lra_bench.record`) and never imports the run."""
