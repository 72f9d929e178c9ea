"""Pricing: every experiment priced before it runs. The planned runs and the cache's state as facts (:mod:`.facts`),
units of work measured on this machine (a run's: :mod:`.units`; the command's around its runs: :mod:`.command_units`;
how each is timed: :mod:`.timing`), the units a plan needs and their measuring (:mod:`.calibrate`), kept per machine,
backbone, device and dtype (:mod:`.calibration`), and the arithmetic from facts and units to the runs' time and
memory (:mod:`.estimate`)."""

from atlas_fast.pricing.estimate import Estimate, estimate_configs, price

__all__ = ["Estimate", "estimate_configs", "price"]
