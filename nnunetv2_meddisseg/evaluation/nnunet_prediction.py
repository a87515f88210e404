"""Predicting a test set with trained nnU-Net models, only where predictions are missing."""
import contextlib
import os
import sys
from typing import List, Sequence

from tqdm import tqdm

from nnunetv2_meddisseg.environment import trainer_output_folder

__all__ = ["find_trained_model", "predict_missing_cases"]


def find_trained_model(dataset_name: str, trainer: str, plans: Sequence[str], configuration: str,
                       fold: str, checkpoint: str) -> str:
    """The first model folder (over ``plans``) with a ``fold_<fold>/<checkpoint>``, else FileNotFoundError."""
    tried = []
    for p in plans:
        folder = str(trainer_output_folder(dataset_name, trainer, p, configuration))
        ckpt = os.path.join(folder, f"fold_{fold}", checkpoint)
        if os.path.isfile(ckpt):
            return folder
        tried.append(ckpt)
    missing = f"{tried[0]} not found" if len(tried) == 1 else f"neither {' nor '.join(tried)} found"
    raise FileNotFoundError(f"no trained model: {missing} (train it first, or pick another --checkpoint such as "
                            f"checkpoint_best.pth)")


def predict_missing_cases(model_dir: str, fold: str, checkpoint: str, images_dir: str, file_ending: str,
                          output_dir: str, device: str = "cpu", num_processes: int = 0,
                          overwrite: bool = False, progress: bool = True) -> List[str]:
    """Predict every case of ``images_dir`` without a ``<case><ending>`` in ``output_dir``; return their ids. The
    checkpoint is read weights-only; nnU-Net's console output goes to ``output_dir/predict_log.txt``."""
    from nnunetv2.utilities.utils import create_lists_from_splitted_dataset_folder

    if not os.path.isdir(images_dir):
        raise FileNotFoundError(f"test image folder not found: {images_dir}")
    lists = create_lists_from_splitted_dataset_folder(images_dir, file_ending)
    if not lists:
        raise ValueError(f"{images_dir} holds no images ending in _0000{file_ending}")
    cases = [os.path.basename(fs[0])[:-(len(file_ending) + 5)] for fs in lists]
    todo = [(c, fs) for c, fs in zip(cases, lists)
            if overwrite or not os.path.isfile(os.path.join(output_dir, c + file_ending))]
    if not todo:
        return []
    import torch  # heavy imports only when something is to be predicted
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

    from nnunetv2_meddisseg.torch_files import initialize_predictor

    os.makedirs(output_dir, exist_ok=True)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but no CUDA device is available")
    log_file = os.path.join(output_dir, "predict_log.txt")
    with open(log_file, "a", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        predictor = nnUNetPredictor(tile_step_size=0.5, use_gaussian=True, use_mirroring=True,
                                    perform_everything_on_device=dev.type == "cuda", device=dev,
                                    verbose=False, allow_tqdm=False)
        initialize_predictor(predictor, model_dir, [fold], checkpoint)
        outputs = [os.path.join(output_dir, c) for c, _ in todo]
        if num_processes > 0:
            predictor.predict_from_files([fs for _, fs in todo], outputs, overwrite=True,
                                         num_processes_preprocessing=num_processes,
                                         num_processes_segmentation_export=num_processes)
        else:
            for (c, fs), o in tqdm(list(zip(todo, outputs)), desc=f"predicting {os.path.basename(model_dir)}",
                                   disable=None if progress else True, file=sys.stderr):
                predictor.predict_from_files_sequential([fs], [o], overwrite=True)
    return [c for c, _ in todo]
