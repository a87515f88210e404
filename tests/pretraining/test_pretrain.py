"""``nnUNetv2_meddisseg_pretrain`` on a hand-written tiny dataset (tests/pretraining/tiny_dataset.py): the loss
decreases; the file loads through nnU-Net's ``load_pretrained_weights`` (nnU-Net's network) and through
``nnUNetv2_meddisseg_plan --encoder_weights`` (Med-DisSeg's encoder) with exactly the pretrained tensors; the test
images and the fold's validation cases are never read; a run killed with SIGKILL and started again ends with the
weights of an uninterrupted run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_dataset import DATASET, TEST, TRAIN, VAL, meddisseg_plans, tiny_dataset

from nnunetv2_meddisseg.pretraining.pretrain import checkpoint_path, main
from nnunetv2_meddisseg.pretraining.restoration import corrupt


def _pretrain(output: Path, *extra: str) -> int:
    return main(["-d", DATASET, "-f", "0", "-o", str(output), "--device", "cpu", "--no_progress", *extra])


def _weights(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def test_corruption_is_seeded_and_changes_the_image():
    batch = torch.randn(3, 3, 32, 32)
    first = corrupt(batch, torch.Generator().manual_seed(5))
    assert torch.equal(first, corrupt(batch, torch.Generator().manual_seed(5)))
    assert first.shape == batch.shape and not torch.equal(first, batch)
    assert not torch.equal(first, corrupt(batch, torch.Generator().manual_seed(6)))


def test_nnunet_network_loss_decreases_and_file_loads_through_nnunet(nnunet_dirs, tmp_path):
    from nnunetv2.run.load_pretrained_weights import load_pretrained_weights
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

    folder = tiny_dataset(nnunet_dirs)
    output = tmp_path / "out" / "nnunet.pth"
    output.parent.mkdir()
    assert _pretrain(output, "--epochs", "6", "--iterations_per_epoch", "15", "--method", "restoration") == 0
    saved = _weights(output)
    record = saved["pretraining"]
    assert record["method"] == "models_genesis_restoration" and record["network"] == "nnunet_network"
    assert np.mean(record["losses"][-3:]) < 0.9 * record["losses"][0], record["losses"]  # fresh corruptions: noisy
    assert record["cases"] == len(TRAIN) and not record["validation_cases_used"]
    assert not checkpoint_path(output).exists() and sorted(p.name for p in output.parent.iterdir()) == ["nnunet.pth"]

    # the network nnU-Net's trainer builds for the segmentation task (2 classes, deep supervision on)
    architecture = json.loads((folder / "nnUNetPlans.json").read_text())["configurations"]["2d"]["architecture"]
    network = get_network_from_plans(architecture["network_class_name"], architecture["arch_kwargs"],
                                     architecture["_kw_requires_import"], 3, 2, deep_supervision=True)
    load_pretrained_weights(network, str(output))
    pretrained = saved["network_weights"]
    loaded = network.state_dict()
    assert set(loaded) == set(pretrained)
    compared = [k for k in loaded if ".seg_layers." not in k]
    assert len(compared) > 20
    for key in compared:
        assert torch.equal(loaded[key], pretrained[key]), key
    assert pretrained["decoder.seg_layers.1.weight"].shape[0] == 3  # the reconstruction head: one output per channel


def test_meddisseg_encoder_file_reaches_the_network_through_the_plans(nnunet_dirs, tmp_path):
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager

    from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder
    from nnunetv2_meddisseg.planning.plan_meddisseg import plan_meddisseg
    from nnunetv2_meddisseg.training.network_from_plans import build_meddisseg_network, load_plans_encoder_weights

    tiny_dataset(nnunet_dirs)
    meddisseg_plans()
    output = tmp_path / "encoder.pth"
    assert _pretrain(output, "-p", "nnUNetMedDisSegPlans", "--epochs", "1", "--iterations_per_epoch", "2") == 0
    saved = _weights(output)
    assert saved["pretraining"]["network"] == "meddisseg_encoder"
    pretrained = saved["network_weights"]
    assert set(pretrained) == {f"encoder.{k}" for k in ResNet50Encoder(3).state_dict()}

    plans_file = plan_meddisseg(DATASET, plans_name="PretrainedPlans", batch_size=2, memory_from="estimate",
                                encoder_weights=str(output))
    manager = PlansManager(json.loads(plans_file.read_text())).get_configuration("2d")
    assert manager.network_arch_init_kwargs["encoder_weights"] == str(output)
    network = build_meddisseg_network(manager, 3, 2)
    load_plans_encoder_weights(network, manager)
    for key, value in network.encoder.state_dict().items():
        assert torch.equal(value, pretrained[f"encoder.{key}"]), key


class _Reads:
    """The paths this process opens (Python's ``open`` audit event, NumPy's and blosc2's loads)."""

    def __init__(self):
        self.paths, self.active = [], False
        sys.addaudithook(self._hook)

    def _hook(self, event, args):
        if self.active and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            self.paths.append(os.path.abspath(os.fsdecode(args[0])))


_READS = None


@pytest.fixture
def reads(monkeypatch):
    global _READS
    if _READS is None:
        _READS = _Reads()  # an audit hook stays for the whole process: one, switched on per test
    import blosc2

    real_np_load, real_blosc2_open = np.load, blosc2.open
    monkeypatch.setattr(np, "load", lambda file, *a, **k: (_READS.paths.append(os.path.abspath(file)),
                                                           real_np_load(file, *a, **k))[1])
    monkeypatch.setattr(blosc2, "open", lambda *a, **k: (_READS.paths.append(os.path.abspath(k.get("urlpath", a[0]
                                                                                                   if a else ""))),
                                                         real_blosc2_open(*a, **k))[1])
    _READS.paths, _READS.active = [], True
    yield _READS.paths
    _READS.active = False


def test_test_images_and_validation_cases_are_never_read(nnunet_dirs, tmp_path, reads):
    folder = tiny_dataset(nnunet_dirs)
    raw = nnunet_dirs["nnUNet_raw"] / DATASET
    reads.clear()  # the dataset's own writing
    assert _pretrain(tmp_path / "a.pth", "--epochs", "1", "--iterations_per_epoch", "8") == 0
    data = folder / "nnUNetPlans_2d"
    read_cases = {Path(p).name for p in reads if Path(p).parent == data}
    assert read_cases and read_cases <= {f"{c}.npy" for c in TRAIN}
    assert not [p for p in reads if p.startswith(str(raw))]  # nothing of nnUNet_raw, imagesTs included

    reads.clear()
    assert _pretrain(tmp_path / "b.pth", "--epochs", "1", "--iterations_per_epoch", "8",
                     "--use_validation_cases") == 0
    assert {f"{c}.npy" for c in VAL} & {Path(p).name for p in reads}  # the control: asked for, they are read
    assert not [p for p in reads if p.startswith(str(raw / "imagesTs"))]


def test_unlabelled_folder_is_preprocessed_and_read(nnunet_dirs, tmp_path, reads):
    tiny_dataset(nnunet_dirs)
    extra = tmp_path / "unlabelled"
    extra.mkdir()
    test_image = nnunet_dirs["nnUNet_raw"] / DATASET / "imagesTs" / f"{TEST[0]}_0000.png"
    (extra / "more_000_0000.png").write_bytes(test_image.read_bytes())  # another image in the dataset's format
    reads.clear()
    assert _pretrain(tmp_path / "u.pth", "--epochs", "1", "--iterations_per_epoch", "2",
                     "--unlabelled_folder", str(extra)) == 0
    assert str(extra / "more_000_0000.png") in reads and _weights(tmp_path / "u.pth")["pretraining"][
        "unlabelled_cases"] == 1
    assert not [p for p in reads if p.startswith(str(nnunet_dirs["nnUNet_raw"]))]


def _command(output: Path, env: dict) -> subprocess.Popen:
    args = [sys.executable, "-m", "nnunetv2_meddisseg.pretraining.pretrain", "-d", DATASET, "-f", "0", "-o",
            str(output), "--device", "cpu", "--no_progress", "--epochs", "2", "--iterations_per_epoch", "20",
            "--seed", "3"]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.e2e
def test_resume_after_sigkill_gives_the_weights_of_an_uninterrupted_run(nnunet_dirs, tmp_path):
    tiny_dataset(nnunet_dirs)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    whole = _command(tmp_path / "whole.pth", env)
    out, err = whole.communicate(timeout=300)
    assert whole.returncode == 0, err

    killed_output = tmp_path / "killed.pth"
    killed = _command(killed_output, env)
    deadline = time.monotonic() + 300
    while not checkpoint_path(killed_output).exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL and not killed_output.exists()
    assert torch.load(checkpoint_path(killed_output), weights_only=True)["epoch"] == 1

    resumed = _command(killed_output, env)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert "resuming from" in out + err and not checkpoint_path(killed_output).exists()
    a, b = _weights(tmp_path / "whole.pth"), _weights(killed_output)
    assert a["pretraining"]["losses"] == b["pretraining"]["losses"]
    assert set(a["network_weights"]) == set(b["network_weights"])
    for key, value in a["network_weights"].items():
        assert torch.equal(value, b["network_weights"][key]), key


def test_the_default_method_is_masked_image_modelling():
    """The default chosen on validation data (benchmarks/RESULTS.md, "Choosing the pretraining method")."""
    from nnunetv2_meddisseg.pretraining.pretrain import PretrainSettings, _parser

    assert _parser().get_default("method") == "masked" == PretrainSettings().method
