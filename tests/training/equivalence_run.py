"""A seeded smoke training in one process, reduced to numbers that any change of the training code would move.

``python equivalence_run.py DATASET TRAINER [--compile]`` (nnU-Net's folders and ``nnUNet_meddisseg_seed`` in the
environment, the dataset planned and preprocessed for 2d) trains fold 0 with ``TRAINER`` on the CPU exactly as
``nnUNetv2_train`` does (``run_training``, then the final validation), with one thread and batches made in this
process, and prints one JSON object: the loss of every training and validation step, the sha256 of the final
weights, the final validation's foreground Dice, and what the numbers came from: the CPU kernels torch runs, the
CPU's vendor and the versions of the packages that compute or feed them (``versions``).

``--compile``: the trainer compiles as it would on a GPU (its compile decision says yes; dynamo traces with the
"eager" backend, no inductor), and the JSON also holds dynamo's count of graphs after every phase of the run
(``graphs``: ``[phase, count]`` pairs, phases ``epoch N training`` / ``epoch N validation`` / ``final validation``)
and the trainer's log lines about torch.compile.
"""
import hashlib
import importlib.metadata
import json
import os
import sys

import torch

NUMERIC_PACKAGES = ("torch", "numpy", "scipy", "nnunetv2", "batchgeneratorsv2", "dynamic_network_architectures")


def cpu_vendor():
    """The CPU's vendor (``vendor_id`` in /proc/cpuinfo, None where there is none): AVX512 kernels of oneDNN and
    MKL round differently on Intel and AMD CPUs."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), None)
    except OSError:
        return None


def weights_sha256(state_dict: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.numpy().tobytes() if tensor.dtype != torch.bfloat16 else tensor.float().numpy().tobytes())
    return digest.hexdigest()


def main(dataset: str, trainer_name: str, compile_eagerly: bool = False) -> dict:
    from nnunetv2.run.run_training import get_trainer_from_args
    from torch._dynamo.utils import counters

    os.environ["nnUNet_n_proc_DA"] = "0"
    torch.set_num_threads(1)
    if compile_eagerly:
        from nnunetv2_meddisseg.training.compilation import CompileDecision
        from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg

        os.environ.pop("nnUNet_compile", None)
        nnUNetTrainerMedDisSeg.compile_backend = "eager"
        nnUNetTrainerMedDisSeg._decide_compilation = lambda self: CompileDecision(True, "forced by the test")
    else:
        os.environ["nnUNet_compile"] = "false"
    trainer = get_trainer_from_args(dataset, "2d", 0, trainer_name, "nnUNetPlans", device=torch.device("cpu"))
    graphs = []
    for hook, phase in (("on_train_epoch_end", "training"), ("on_validation_epoch_end", "validation")):
        def counted(outputs, hook=getattr(trainer, hook), phase=phase):
            hook(outputs)
            graphs.append([f"epoch {trainer.current_epoch} {phase}", counters["stats"]["unique_graphs"]])
        setattr(trainer, hook, counted)
    train_losses, val_losses = [], []
    train_step, validation_step = trainer.train_step, trainer.validation_step

    def recorded_train_step(batch):
        result = train_step(batch)
        train_losses.append(float(result["loss"]))
        return result

    def recorded_validation_step(batch):
        result = validation_step(batch)
        val_losses.append(float(result["loss"]))
        return result

    trainer.train_step, trainer.validation_step = recorded_train_step, recorded_validation_step
    trainer.run_training()
    trainer.perform_actual_validation(False)
    graphs.append(["final validation", counters["stats"]["unique_graphs"]])
    with open(os.path.join(trainer.output_folder, "validation", "summary.json")) as f:
        foreground_dice = json.load(f)["foreground_mean"]["Dice"]
    network = trainer.network.module if hasattr(trainer.network, "module") else trainer.network
    network = getattr(network, "_orig_mod", network)
    versions = {name: importlib.metadata.version(name) for name in NUMERIC_PACKAGES}
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_vendor": cpu_vendor(), "versions": versions,
            "train_losses": train_losses, "val_losses": val_losses,
            "weights_sha256": weights_sha256(network.state_dict()), "final_validation_dice": foreground_dice,
            "graphs": graphs, "compile_log": compile_log_lines(trainer.log_file)}


def compile_log_lines(log_file: str) -> list:
    with open(log_file) as f:
        return [line.split(": ", 1)[-1].strip() for line in f if "torch.compile" in line]


if __name__ == "__main__":
    print("EQUIVALENCE " + json.dumps(main(sys.argv[1], sys.argv[2], "--compile" in sys.argv[3:])))
