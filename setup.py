"""Packaging lives in setup.cfg; this file adds only what setup.cfg cannot say: the experiment modules sit in the
top-level ``experiments/`` folder (one module per paper table or figure) and install as ``atlas_fast.experiments``,
so ``atlas-fast experiment NAME`` and ``python -m atlas_fast.experiments NAME`` work from any folder."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["atlas_fast", "atlas_fast.*"]) + ["atlas_fast.experiments"],
    package_dir={"atlas_fast.experiments": "experiments"},
)
