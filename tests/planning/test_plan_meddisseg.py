import json
from pathlib import Path

import pytest
import torch

from nnunet_cli import run_cli
from nnunetv2_meddisseg.cli import UserError
from nnunetv2_meddisseg.planning.plan_meddisseg import (NETWORK_CLASS_NAME, build_meddisseg_plans,
                                                        estimate_batch_size)


def _source_plans(patch=(72, 60), configs=("2d",)) -> dict:
    config = {"data_identifier": "nnUNetPlans_2d", "batch_size": 12, "patch_size": list(patch),
              "median_image_size_in_voxels": [300, 300],
              "architecture": {"network_class_name": "PlainConvUNet", "arch_kwargs": {}, "_kw_requires_import": []}}
    return {"dataset_name": "Dataset999_X", "plans_name": "nnUNetPlans",
            "configurations": {c: dict(config) for c in configs}}


def test_patch_size_rounded_to_multiple_of_16_and_data_reused():
    plans = build_meddisseg_plans(_source_plans((72, 60)), batch_size=3)
    config = plans["configurations"]["2d"]
    assert config["patch_size"] == [80, 64]
    assert config["batch_size"] == 3
    assert config["data_identifier"] == "nnUNetPlans_2d"
    assert config["architecture"]["network_class_name"] == NETWORK_CLASS_NAME
    assert plans["plans_name"] == "nnUNetMedDisSegPlans"


def test_only_2d_configuration_is_kept():
    plans = build_meddisseg_plans(_source_plans(configs=("2d", "3d_fullres")), batch_size=2)
    assert list(plans["configurations"]) == ["2d"]


def test_3d_only_dataset_is_refused():
    with pytest.raises(UserError, match="no '2d' configuration"):
        build_meddisseg_plans(_source_plans(configs=("3d_fullres",)))


@pytest.mark.parametrize("patch", [(50, 64), (64, 0), (64,)])
def test_patch_size_must_be_two_multiples_of_16(patch):
    with pytest.raises(UserError, match="--patch-size"):
        build_meddisseg_plans(_source_plans(), patch_size=patch, batch_size=2)


def test_batch_size_follows_memory_budget():
    small = estimate_batch_size((256, 256), memory_target_gb=8)
    large = estimate_batch_size((256, 256), memory_target_gb=24)
    assert 2 <= small < large
    assert estimate_batch_size((512, 512), memory_target_gb=8) <= small
    assert estimate_batch_size((256, 256), 80, max_batch_size=3) == 3


def test_plan_command_writes_plans_that_nnunet_builds(preprocessed_synthetic):
    env = preprocessed_synthetic
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--activation", "relu"], env)
    assert "nnUNetMedDisSegPlans.json" in proc.stdout
    plans_file = Path(env["nnUNet_preprocessed"]) / "Dataset501_SyntheticPolyps" / "nnUNetMedDisSegPlans.json"
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans
    from nnunetv2.utilities.plans_handling.plans_handler import PlansManager
    from nnunetv2_meddisseg.architectures import MedDisSegNet

    config = PlansManager(str(plans_file)).get_configuration("2d")
    assert config.data_identifier == "nnUNetPlans_2d"
    network = get_network_from_plans(config.network_arch_class_name, config.network_arch_init_kwargs,
                                     config.network_arch_init_kwargs_req_import, 3, 2, deep_supervision=False)
    assert isinstance(network, MedDisSegNet)
    network.eval()
    with torch.no_grad():
        out = network(torch.randn(1, 3, *config.patch_size))
    assert out.shape == (1, 2, *config.patch_size)


def test_plan_command_errors_are_one_line(preprocessed_synthetic, tmp_path):
    env = dict(preprocessed_synthetic)
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "777"], env, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "-d 777" in proc.stderr and "Traceback" not in proc.stderr

    missing = tmp_path / "nope.pth"
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--encoder-weights", missing, "--plans-name", "X"],
                   env, check=False)
    assert proc.returncode == 2 and str(missing) in proc.stderr and proc.stderr.count("\n") == 1

    not_a_state_dict = tmp_path / "list.pth"
    torch.save([1, 2, 3], not_a_state_dict)
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--encoder-weights", not_a_state_dict,
                    "--plans-name", "X"], env, check=False)
    assert proc.returncode == 2 and "list.pth" in proc.stderr and proc.stderr.count("\n") == 1

    import torchvision
    state = torchvision.models.resnet50(weights=None).state_dict()
    state["layer2.0.conv1.weight"] = torch.zeros(3, 3, 1, 1)
    wrong_shape = tmp_path / "wrong.pth"
    torch.save(state, wrong_shape)
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--encoder-weights", wrong_shape,
                    "--plans-name", "X"], env, check=False)
    assert proc.returncode == 2 and "layer2.0.conv1.weight" in proc.stderr
    assert not (Path(env["nnUNet_preprocessed"]) / "Dataset501_SyntheticPolyps" / "X.json").exists()


def test_unpreprocessed_dataset_is_refused(preprocessed_synthetic, tmp_path):
    from nnunet_cli import nnunet_env
    from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset

    env = nnunet_env(tmp_path)
    make_synthetic_dataset(env["nnUNet_raw"], dataset_id=502, num_train=2, num_test=1, size=32)
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "502"], env, check=False)
    assert proc.returncode == 2 and "nnUNetv2_plan_and_preprocess" in proc.stderr
