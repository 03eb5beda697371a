"""The user's workflow: predict, its inputs and outputs, the demo and the command line."""
