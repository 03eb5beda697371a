import os

# The CLI's persistent compilation cache stays off in tests: no writes to the user's cache, and no
# test's timing or compilation depends on what an earlier run left there.
os.environ.setdefault("LVFLOW_CACHE_DIR", "off")

import jax

jax.config.update("jax_enable_x64", True)

import lvflow  # noqa: E402,F401  (switches on float64 too)
