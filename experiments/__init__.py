"""One module per table/figure of the ATLaS paper; run e.g. ``python -m experiments.table3_base_to_new --help``."""
