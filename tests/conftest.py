import jax

jax.config.update("jax_enable_x64", True)

import lvflow  # noqa: E402,F401  (switches on float64 too)
