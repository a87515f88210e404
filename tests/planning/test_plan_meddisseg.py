import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from nnunet_cli import run_cli

from nnunetv2_meddisseg.errors import UserError
from nnunetv2_meddisseg.planning.memory import batch_size_for_memory, estimated_memory_line
from nnunetv2_meddisseg.planning.plan_meddisseg import build_meddisseg_plans, main
from nnunetv2_meddisseg.plans_architecture import NETWORK_CLASS_NAME
from nnunetv2_meddisseg.training.errors import TrainingInputError


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
    with pytest.raises(UserError, match="--patch_size"):
        build_meddisseg_plans(_source_plans(), patch_size=patch, batch_size=2)


def test_batch_size_follows_memory_budget():
    def estimate(patch, target, max_batch_size=None):
        return batch_size_for_memory(estimated_memory_line(patch), target, max_batch_size=max_batch_size)

    small, large = estimate((256, 256), 8), estimate((256, 256), 24)
    assert 2 <= small < large
    assert estimate((512, 512), 8) <= small
    assert estimate((256, 256), 80, max_batch_size=3) == 3


def test_plan_command_writes_plans_that_nnunet_builds(preprocessed_synthetic):
    env = preprocessed_synthetic
    # a plans name of its own: the session's other tests plan nnUNetMedDisSegPlans with the defaults
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--activation", "relu", "--plans_name", "PlansReLU"], env)
    assert "PlansReLU.json" in proc.stdout
    plans_file = Path(env["nnUNet_preprocessed"]) / "Dataset501_SyntheticPolyps" / "PlansReLU.json"
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


def _network_of(env, plans_name: str):
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

    plans_file = Path(env["nnUNet_preprocessed"]) / "Dataset501_SyntheticPolyps" / f"{plans_name}.json"
    plans = json.loads(plans_file.read_text())
    architecture = plans["configurations"]["2d"]["architecture"]
    network = get_network_from_plans(architecture["network_class_name"], architecture["arch_kwargs"],
                                     architecture["_kw_requires_import"], 3, 2, deep_supervision=True)
    return architecture, network


def _running_statistics_outside_the_encoder(network) -> list:
    encoder = set(network.encoder.modules())
    return [m for m in network.modules() if getattr(m, "track_running_stats", False) and m not in encoder]


def test_default_plans_keep_no_running_statistics_outside_the_encoder(preprocessed_synthetic):
    """The plan command's default: InstanceNorm in every block added to the ResNet-50 (nnU-Net builds the
    network from the plans file), BatchNorm only in the encoder."""
    from nnunetv2_meddisseg.blocks.norm import SingleKernelInstanceNorm2d as InstanceNorm2d

    env = preprocessed_synthetic
    run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--plans_name", "PlansDefault"], env)
    architecture, network = _network_of(env, "PlansDefault")
    assert architecture["arch_kwargs"]["added_norm_op"] == "nnunetv2_meddisseg.blocks.norm.SingleKernelInstanceNorm2d"
    assert "added_norm_op" in architecture["_kw_requires_import"]
    encoder = set(network.encoder.modules())
    added = [m for m in network.modules() if isinstance(m, InstanceNorm2d)]
    assert added and not encoder.intersection(added)
    assert not _running_statistics_outside_the_encoder(network)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in encoder)
    explicit = build_meddisseg_plans(_source_plans(), added_norm="instance")["configurations"]["2d"]["architecture"]
    assert explicit["arch_kwargs"] == architecture["arch_kwargs"] | {"encoder_weights": None}


def test_added_norm_batch_is_the_papers_batchnorm_everywhere(preprocessed_synthetic):
    env = preprocessed_synthetic
    run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--added_norm", "batch", "--plans_name", "PlansBN"], env)
    architecture, network = _network_of(env, "PlansBN")
    assert "added_norm_op" not in architecture["arch_kwargs"]
    assert "added_norm_op" not in architecture["_kw_requires_import"]
    outside = _running_statistics_outside_the_encoder(network)
    assert outside and all(isinstance(m, torch.nn.BatchNorm2d) for m in outside)


def test_plan_command_errors_are_one_line(preprocessed_synthetic, tmp_path):
    env = dict(preprocessed_synthetic)
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "777"], env, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "-d 777" in proc.stderr and "Traceback" not in proc.stderr

    missing = tmp_path / "nope.pth"
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--encoder_weights", missing, "--plans_name", "X"],
                   env, check=False)
    assert proc.returncode == 2 and str(missing) in proc.stderr and proc.stderr.count("\n") == 1

    not_a_state_dict = tmp_path / "list.pth"
    torch.save([1, 2, 3], not_a_state_dict)
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--encoder_weights", not_a_state_dict,
                    "--plans_name", "X"], env, check=False)
    assert proc.returncode == 2 and "list.pth" in proc.stderr and proc.stderr.count("\n") == 1

    import torchvision
    state = torchvision.models.resnet50(weights=None).state_dict()
    state["layer2.0.conv1.weight"] = torch.zeros(3, 3, 1, 1)
    wrong_shape = tmp_path / "wrong.pth"
    torch.save(state, wrong_shape)
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "501", "--encoder_weights", wrong_shape,
                    "--plans_name", "X"], env, check=False)
    assert proc.returncode == 2 and "layer2.0.conv1.weight" in proc.stderr
    assert not (Path(env["nnUNet_preprocessed"]) / "Dataset501_SyntheticPolyps" / "X.json").exists()


def test_unpreprocessed_dataset_is_refused(preprocessed_synthetic, tmp_path):
    from nnunet_cli import nnunet_env

    from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset

    env = nnunet_env(tmp_path)  # a dataset of its own: one that was converted and never preprocessed
    make_synthetic_dataset(env["nnUNet_raw"], dataset_id=502, num_train=2, num_test=1, size=32)
    proc = run_cli(["nnUNetv2_meddisseg_plan", "-d", "502"], env, check=False)
    assert proc.returncode == 2 and "nnUNetv2_plan_and_preprocess" in proc.stderr


IMAGENET_URL = "https://download.pytorch.org/models/resnet50-0676ba61.pth"
IMAGENET_FILE = ("hub", "checkpoints", "resnet50-0676ba61.pth")  # under TORCH_HOME, as torchvision caches it


def _refuse(*args, **kwargs):
    raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")


@pytest.fixture
def in_process_env(preprocessed_synthetic, tmp_path, monkeypatch):
    """The synthetic dataset's nnU-Net environment and an empty TORCH_HOME in this process, no network."""
    for key, value in preprocessed_synthetic.items():
        if key.startswith("nnUNet"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("nnUNet_results", str(tmp_path / "results"))  # the trainers' log folders: this test's own
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", _refuse)
    monkeypatch.setattr(urllib.request, "urlopen", _refuse)
    monkeypatch.setattr(socket.socket, "connect", _refuse)
    monkeypatch.setattr(socket, "getaddrinfo", _refuse)  # not even a name lookup
    return Path(preprocessed_synthetic["nnUNet_preprocessed"]) / "Dataset501_SyntheticPolyps"


def _seed_imagenet_cache(torch_home: Path) -> dict:
    """A ResNet-50 state dict of torchvision's keys and shapes (random values, BN statistics included)
    at the file torchvision's IMAGENET1K_V1 weights are cached as."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 1.5)
    path = torch_home.joinpath(*IMAGENET_FILE)
    path.parent.mkdir(parents=True)
    torch.save(model.state_dict(), path)
    return model.state_dict()


def _trainer(folder: Path, plans_name: str):
    from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg

    plans = json.loads((folder / f"{plans_name}.json").read_text())
    plans["continue_training"] = False  # what nnUNetv2_train's get_trainer_from_args passes for a new run
    dataset_json = json.loads((folder / "dataset.json").read_text())
    return nnUNetTrainerMedDisSeg(plans=plans, configuration="2d", fold=0, dataset_json=dataset_json,
                                  device=torch.device("cpu"))


def test_imagenet_weights_from_seeded_cache_reach_planning_and_training(in_process_env, tmp_path, capsys):
    folder = in_process_env
    state = _seed_imagenet_cache(tmp_path / "torch_home")
    main(["-d", "501", "--encoder_weights", "imagenet", "--plans_name", "ImageNetPlans", "--batch_size", "2"])
    assert str(tmp_path.joinpath("torch_home", *IMAGENET_FILE)) in capsys.readouterr().out
    plans = json.loads((folder / "ImageNetPlans.json").read_text())
    assert plans["configurations"]["2d"]["architecture"]["arch_kwargs"]["encoder_weights"] == "imagenet"

    trainer = _trainer(folder, "ImageNetPlans")
    trainer.initialize()
    encoder = trainer.network.encoder.state_dict()
    for key in ("conv1.weight", "bn1.running_mean", "layer2.0.downsample.0.weight", "layer3.5.bn3.running_var"):
        assert torch.equal(encoder[key], state[key]), key


def test_imagenet_offline_without_cache_is_one_line_error(in_process_env, tmp_path, capsys):
    assert main(["-d", "501", "--encoder_weights", "imagenet", "--plans_name", "ImageNetOffline"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nnUNetv2_meddisseg_plan: error: --encoder_weights imagenet")
    assert str(tmp_path.joinpath("torch_home", *IMAGENET_FILE)) in err and IMAGENET_URL in err
    assert "--encoder_weights PATH" in err
    assert not (in_process_env / "ImageNetOffline.json").exists()


def test_training_never_downloads_imagenet_weights(in_process_env, tmp_path, monkeypatch):
    folder = in_process_env
    _seed_imagenet_cache(tmp_path / "torch_home")
    main(["-d", "501", "--encoder_weights", "imagenet", "--plans_name", "ImageNetMoved", "--batch_size", "2"])
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "another_torch_home"))  # e.g. another machine
    trainer = _trainer(folder, "ImageNetMoved")
    with pytest.raises(TrainingInputError) as info:
        trainer.initialize()
    message = str(info.value)
    assert "\n" not in message and IMAGENET_URL in message and "--encoder_weights PATH" in message
    assert str(tmp_path.joinpath("another_torch_home", *IMAGENET_FILE)) in message
