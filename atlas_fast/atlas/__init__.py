"""ATLaS itself: soft labels (LS, CSL, ISL, their mix), the label schedules that alternate them with one-hot labels
(and the baselines OLS, TF-KD, joint), and the variants that pair the two with the paper's presets and names."""
