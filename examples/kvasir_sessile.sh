#!/usr/bin/env bash
# Kvasir-Sessile (156 / 20 / 20): SOURCE_FOLDER holds images/ and masks/ (sessile-main-Kvasir-SEG).
#   usage: examples/kvasir_sessile.sh SOURCE_FOLDER
# Environment: nnUNet_raw, nnUNet_preprocessed, nnUNet_results (required); SCHEDULE=paper|nnunet
# (default nnunet; paper: nnUNetTrainerMedDisSeg_paper), BATCH_SIZE (default 4, the paper's), EPOCHS (default 1000),
# FOLD (default 0), ENCODER_WEIGHTS (optional torchvision ResNet-50 state dict for the encoder).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SOURCE_FOLDER" >&2; exit 2; }
exec "$(dirname "$0")/_paper_protocol.sh" kvasir-sessile 602 "$@"
