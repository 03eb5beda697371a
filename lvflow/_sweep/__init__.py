"""Sweeps: `predict` over a grid or list of configurations, batched with `vmap`, sharded over devices
and hosts, written in resumable chunks (`lvflow.sweep`, `lvflow sweep`)."""
