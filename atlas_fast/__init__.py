"""atlas_fast: feature-cache-first prompt tuning of CLIP with ATLaS."""

__version__ = "0.1.0"
