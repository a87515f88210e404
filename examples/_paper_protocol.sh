#!/usr/bin/env bash
# Shared by the per-dataset examples: the paper protocol for one dataset, from the user's download.
#   usage: _paper_protocol.sh CONVERTER DATASET_ID SOURCE_FOLDER [extra converter options...]
# Needs nnUNet_raw, nnUNet_preprocessed and nnUNet_results to be set (see the README).
set -euo pipefail
converter=$1; dataset_id=$2; source=$3; shift 3
fold=${FOLD:-0}
resize=${RESIZE:-256}     # "none" keeps the source size (Synapse volumes)
patch=${PATCH:-256}
epochs=${EPOCHS:-1000}
for var in nnUNet_raw nnUNet_preprocessed nnUNet_results; do
    if [ -z "${!var:-}" ]; then echo "$0: error: environment variable $var is not set (see the README)" >&2; exit 2; fi
done
if [ ! -d "$source" ]; then echo "$0: error: source folder '$source' does not exist" >&2; exit 2; fi
export nnUNet_extTrainer=${nnUNet_extTrainer:-$(python -m nnunetv2_meddisseg.trainer_path)}
case $epochs in
    1000) baseline=nnUNetTrainer; ours=nnUNetTrainerMedDisSeg ;;
    *) baseline=nnUNetTrainer_${epochs}epochs; ours=nnUNetTrainerMedDisSeg_${epochs}epochs ;;
esac

cat <<TXT
About to run the Med-DisSeg paper protocol on '$source' (dataset $dataset_id, fold $fold):
  1. convert ($converter, resize: $resize) and preprocess with nnU-Net; Med-DisSeg patch ${patch}x${patch}
  2. train default nnU-Net 2d ($baseline, $epochs epochs x 250 iterations)
  3. train Med-DisSeg ($ours, $epochs epochs x 250 iterations: the first quarter Stage I, then Stage II)
  4. predict the test set with both and compare them with the paper's metrics
Expected cost: two full nnU-Net trainings; on one recent GPU roughly 10-20 GPU hours each (an estimate,
not a measurement; on a CPU it is impractical). Set EPOCHS=250 or 100 for a shorter run. Ctrl-C now to stop.
TXT
sleep "${CONFIRM_DELAY:-10}"

resize_args=(); [ "$resize" = none ] || resize_args=(--resize "$resize")
nnUNetv2_meddisseg_convert "$converter" "$source" -d "$dataset_id" "${resize_args[@]}" "$@"
nnUNetv2_plan_and_preprocess -d "$dataset_id" -c 2d
nnUNetv2_meddisseg_plan -d "$dataset_id" --patch-size "$patch" "$patch" ${ENCODER_WEIGHTS:+--encoder-weights "$ENCODER_WEIGHTS"}
nnUNetv2_train "$dataset_id" 2d "$fold" -tr "$baseline"
nnUNetv2_train "$dataset_id" 2d "$fold" -tr "$ours" -p nnUNetMedDisSegPlans
nnUNetv2_meddisseg_compare -d "$dataset_id" -f "$fold" --baseline-trainer "$baseline" --trainer "$ours" \
    --plans nnUNetMedDisSegPlans
