#!/usr/bin/env bash
# Kvasir-SEG (880 train / 120 test): SOURCE_FOLDER holds images/ and masks/ as the publisher ships them.
#   usage: examples/kvasir_seg.sh SOURCE_FOLDER
# Environment: nnUNet_raw, nnUNet_preprocessed, nnUNet_results (required); SCHEDULE=paper|nnunet
# (default nnunet; paper: nnUNetTrainerMedDisSeg_paper), BATCH_SIZE (default 4, the paper's), EPOCHS (default 1000),
# FOLD (default 0), ENCODER_WEIGHTS (optional torchvision ResNet-50 state dict for the encoder).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SOURCE_FOLDER" >&2; exit 2; }
exec "$(dirname "$0")/_paper_protocol.sh" kvasir-seg 601 "$@"
