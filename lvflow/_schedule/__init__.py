"""The ε → 0 saddle-to-saddle schedule (§4, beyond the paper)."""
