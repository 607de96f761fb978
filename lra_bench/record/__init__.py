"""The result record: its types (`schema`), its file I/O (`results`), the one builder (`builder`), the typed reader
(`reader`), the experiment's identity (`identity`), per-example test outputs (`predictions`), where a result came from
(`provenance`), the curves (`curves`), and reading a checkpoint file (`checkpoint_file`). Below the config and the
run: it imports neither."""
