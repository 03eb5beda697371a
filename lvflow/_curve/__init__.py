"""Reading a loss curve: its plateaus and drops."""
