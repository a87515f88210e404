"""nnU-Net v2 plugin for Med-DisSeg."""
__version__ = "0.1.0"
