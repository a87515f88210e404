"""The folder ``nnUNet_extTrainer`` points at (``python -m nnunetv2_meddisseg.trainer_path`` prints it).

nnU-Net's trainer search imports each module here as a top-level module, then drops it: so ``meddisseg_trainers``
only imports the package's classes (absolutely), and its name must not shadow another top-level module. The
search never imports this ``__init__``; it only makes the folder part of the package.
"""
