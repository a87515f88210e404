"""The folder ``nnUNet_extTrainer`` points at (``python -m nnunetv2_meddisseg.trainer_path`` prints it).

nnU-Net imports every module here as a top-level module while it searches for a trainer by name, then
drops them from ``sys.modules``. So the one module here, ``meddisseg_trainers``, only imports the real
classes from the package (absolute imports), and its name must not shadow any other top-level module.
This ``__init__`` is never imported by that search; it only makes the folder part of the installed package.
"""
