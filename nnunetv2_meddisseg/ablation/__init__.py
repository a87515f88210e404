"""Ablations of Med-DisSeg: ``nnUNetv2_meddisseg_ablate`` (train, predict and tabulate variants) and
``nnUNetv2_meddisseg_features`` (pictures of the feature space at the regularised layer)."""
