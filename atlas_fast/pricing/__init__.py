"""Pricing: every experiment priced before it runs. Units of work measured on this machine (:mod:`.units`), kept per
machine, backbone, device and dtype (:mod:`.calibration`), and the arithmetic from a planned sweep and the cache's
state to the runs' time and memory (:mod:`.estimate`)."""

from atlas_fast.pricing.estimate import Estimate, estimate_configs, price

__all__ = ["Estimate", "estimate_configs", "price"]
