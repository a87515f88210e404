#!/usr/bin/env bash
# ISIC-2017 lesion segmentation (2000 / 150 / 600): SOURCE_FOLDER holds the ISIC-2017_* folders.
#   usage: examples/isic2017.sh SOURCE_FOLDER
# Environment: nnUNet_raw, nnUNet_preprocessed, nnUNet_results (required); SCHEDULE=paper|nnunet
# (default nnunet; paper: nnUNetTrainerMedDisSeg_paper), BATCH_SIZE (default 4, the paper's), EPOCHS (default 1000),
# FOLD (default 0), ENCODER_WEIGHTS (optional torchvision ResNet-50 state dict for the encoder).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SOURCE_FOLDER" >&2; exit 2; }
exec "$(dirname "$0")/_paper_protocol.sh" isic2017 605 "$@"
