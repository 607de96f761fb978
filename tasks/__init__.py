"""LRA tasks: sources, tokenizers, generators and Lightning data modules.

`tasks` never imports `models` or `lra_bench`. Importing `tasks.registry.load_all()` registers every task.
"""
