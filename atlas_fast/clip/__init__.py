"""CLIP plumbing: open_clip backbones and their fingerprints, the text tower on prompt embeddings, deep and visual
prompts in the towers, and the seeded image views (preprocessing and augmentation)."""
