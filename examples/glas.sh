#!/usr/bin/env bash
# GlaS (85 train / 80 test = testA + testB): SOURCE_FOLDER is 'Warwick QU Dataset (Released 2016_07_08)'.
#   usage: examples/glas.sh SOURCE_FOLDER
# Environment: nnUNet_raw, nnUNet_preprocessed, nnUNet_results (required); SCHEDULE=paper|nnunet
# (default nnunet; paper: nnUNetTrainerMedDisSeg_paper), BATCH_SIZE (default 4, the paper's), EPOCHS (default 1000),
# FOLD (default 0), ENCODER_WEIGHTS (optional torchvision ResNet-50 state dict for the encoder).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SOURCE_FOLDER" >&2; exit 2; }
exec "$(dirname "$0")/_paper_protocol.sh" glas 603 "$@"
