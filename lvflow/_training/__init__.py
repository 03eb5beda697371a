"""Training real networks beside their NQF twins (§5)."""
