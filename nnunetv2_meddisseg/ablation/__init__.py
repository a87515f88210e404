"""Ablations of Med-DisSeg: ``nnUNetv2_meddisseg_ablate`` (train, predict and tabulate variants) and the
arms of finished studies (``study_trainers``)."""
