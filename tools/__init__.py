"""Research tools beside the library (not installed with atlas_fast); run them from the repository root."""
