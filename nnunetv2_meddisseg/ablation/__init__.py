"""Ablations of Med-DisSeg: the ``nnUNetv2_meddisseg_ablate`` command and the arms of finished studies."""
