"""Optimisation: optimizers, LR/WD schedulers, precision, loss normalisation, skipped steps."""
