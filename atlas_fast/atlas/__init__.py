"""ATLaS itself: soft labels (LS, CSL, ISL, their mix) and the label schedules that alternate them with one-hot
labels (and the baselines OLS, TF-KD, joint)."""
