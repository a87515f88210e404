#!/usr/bin/env bash
# Shared by the per-dataset examples: the paper protocol for one dataset, from the user's download.
#   usage: _paper_protocol.sh CONVERTER DATASET_ID SOURCE_FOLDER [extra converter options...]
# Needs nnUNet_raw, nnUNet_preprocessed and nnUNet_results to be set (see the README).
set -euo pipefail
converter=$1; dataset_id=$2; source=$3; shift 3
fold=${FOLD:-0}
resize=${RESIZE:-256}     # "none" keeps the source size (Synapse volumes)
patch=${PATCH:-256}
epochs=${EPOCHS:-1000}     # SCHEDULE=nnunet only
schedule=${SCHEDULE:-nnunet}
batch_size=${BATCH_SIZE:-4}  # the paper's batch size, for Med-DisSeg's plan
for var in nnUNet_raw nnUNet_preprocessed nnUNet_results; do
    if [ -z "${!var:-}" ]; then echo "$0: error: environment variable $var is not set (see the README)" >&2; exit 2; fi
done
if [ ! -d "$source" ]; then echo "$0: error: source folder '$source' does not exist" >&2; exit 2; fi
export nnUNet_extTrainer=$(python -m nnunetv2_meddisseg.trainer_path --search_path)
case $epochs in
    1000) baseline=nnUNetTrainer; ours=nnUNetTrainerMedDisSeg ;;
    *) baseline=nnUNetTrainer_${epochs}epochs; ours=nnUNetTrainerMedDisSeg_${epochs}epochs ;;
esac
case $schedule in
    nnunet) ours_schedule="$epochs epochs x 250 iterations, poly learning rate, nnU-Net's augmentation" ;;
    paper) ours=nnUNetTrainerMedDisSeg_paper
           ours_schedule="at most 300 epochs of ceil(training cases / $batch_size) iterations, cosine learning rate, early stopping after 100 epochs without a better EMA pseudo Dice, flips and rotations only" ;;
    *) echo "$0: error: SCHEDULE must be 'paper' or 'nnunet', got '$schedule'" >&2; exit 2 ;;
esac

cat <<TXT
About to run the Med-DisSeg paper protocol on '$source' (dataset $dataset_id, fold $fold):
  1. convert ($converter, resize: $resize) and preprocess with nnU-Net; Med-DisSeg patch ${patch}x${patch}
  2. train default nnU-Net 2d ($baseline, $epochs epochs x 250 iterations)
  3. train Med-DisSeg ($ours, batch size $batch_size, schedule '$schedule': $ours_schedule;
     the first quarter of the epochs Stage I, then Stage II)
  4. predict the test set with both and compare them with the paper's metrics
Expected cost: default nnU-Net is a full nnU-Net training, on one recent GPU roughly 10-20 GPU hours (an
estimate, not a measurement; on a CPU it is impractical); Med-DisSeg the same with SCHEDULE=nnunet, and
with SCHEDULE=paper (the paper's own schedule) 300 x ceil(training cases / $batch_size) iterations at most,
for Kvasir-SEG's ~800 training cases about 60,000 against nnU-Net's 250,000. Set EPOCHS=250 or 100
(SCHEDULE=nnunet) for a shorter run. Ctrl-C now to stop.
TXT
sleep "${CONFIRM_DELAY:-10}"

resize_args=(); [ "$resize" = none ] || resize_args=(--resize "$resize")
nnUNetv2_meddisseg_convert "$converter" "$source" -d "$dataset_id" "${resize_args[@]}" "$@"
nnUNetv2_plan_and_preprocess -d "$dataset_id" -c 2d
nnUNetv2_meddisseg_plan -d "$dataset_id" --patch_size "$patch" "$patch" --batch_size "$batch_size" \
    ${ENCODER_WEIGHTS:+--encoder_weights "$ENCODER_WEIGHTS"}
nnUNetv2_train "$dataset_id" 2d "$fold" -tr "$baseline"
nnUNetv2_train "$dataset_id" 2d "$fold" -tr "$ours" -p nnUNetMedDisSegPlans
nnUNetv2_meddisseg_compare -d "$dataset_id" -f "$fold" --baseline_trainer "$baseline" --trainer "$ours" \
    --plans nnUNetMedDisSegPlans
