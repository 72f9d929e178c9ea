"""The embedded default world: generated benchmark datasets and a small CLIP pretrained on them."""
