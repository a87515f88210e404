#!/usr/bin/env bash
# Synapse multi-organ CT (BTCV, 8 organs of the TransUNet protocol, 18 train / 12 test volumes):
# SOURCE_FOLDER holds RawData/Training/img and label (or TransUNet's train_npz + test_vol_h5, with h5py).
# Volumes stay 3D; nnU-Net's 2d configuration trains slice-wise; Med-DisSeg patch 224x224 as TransUNet.
#   usage: examples/synapse.sh SOURCE_FOLDER
# Environment: nnUNet_raw, nnUNet_preprocessed, nnUNet_results (required); SCHEDULE=paper|nnunet
# (default nnunet; paper: nnUNetTrainerMedDisSeg_paper), BATCH_SIZE (default 4, the paper's), EPOCHS (default 1000),
# FOLD (default 0), ENCODER_WEIGHTS (optional torchvision ResNet-50 state dict for the encoder).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SOURCE_FOLDER" >&2; exit 2; }
RESIZE=none PATCH=${PATCH:-224} exec "$(dirname "$0")/_paper_protocol.sh" synapse 606 "$@"
