"""Hydra plugin package (Hydra only instantiates plugins from the `hydra_plugins` namespace): the sweeper that
validates every job of a sweep before launching any (`hydra/sweeper=lra`, the default in conf/config.yaml)."""
