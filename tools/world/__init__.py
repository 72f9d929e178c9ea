"""The embedded world's research tools: its CLIP's two pretraining stages, calibration, property measurements."""
