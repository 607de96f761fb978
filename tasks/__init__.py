"""LRA tasks: sources, tokenizers, generators and Lightning data modules (one `LRADataModule` subclass per task,
with its own `name` and `config`, discovered by `lra_bench.registry`).

`tasks` never imports `models` or `lra_bench`.
"""

from tasks.sources import offline_unless_allowed

offline_unless_allowed()  # the HF hub only when the user allows it (tasks.sources): before `datasets` is imported
