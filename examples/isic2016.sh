#!/usr/bin/env bash
# ISIC-2016 lesion segmentation (900 / 379): SOURCE_FOLDER holds the ISBI2016_ISIC_Part1_* folders.
#   usage: examples/isic2016.sh SOURCE_FOLDER
# Environment: nnUNet_raw, nnUNet_preprocessed, nnUNet_results (required); SCHEDULE=paper|nnunet
# (default nnunet; paper: nnUNetTrainerMedDisSeg_paper), BATCH_SIZE (default 4, the paper's), EPOCHS (default 1000),
# FOLD (default 0), ENCODER_WEIGHTS (optional torchvision ResNet-50 state dict for the encoder).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SOURCE_FOLDER" >&2; exit 2; }
exec "$(dirname "$0")/_paper_protocol.sh" isic2016 604 "$@"
