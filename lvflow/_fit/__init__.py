"""Fitting a training curve: infer a spectrum from an observed loss and predict the drops to come."""
