"""The neural quadratic form and its exact dynamics on (M, μ) (§1–2)."""
