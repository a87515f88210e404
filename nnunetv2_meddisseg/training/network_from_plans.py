"""What ``nnUNetTrainerMedDisSeg`` reads from and records in nnU-Net's plans: whether they build MedDisSegNet, the
plans saved with a model, the 2D requirement, the network, and the encoder weights."""
import os
from copy import deepcopy
from pydoc import locate
from typing import Optional

from nnunetv2.utilities.get_network_from_plans import get_network_from_plans
from nnunetv2.utilities.plans_handling.plans_handler import ConfigurationManager, PlansManager
from torch import nn

from nnunetv2_meddisseg.architectures import MedDisSegNet
from nnunetv2_meddisseg.blocks.encoder import load_resnet50_weights, resolve_encoder_weights
from nnunetv2_meddisseg.plans_architecture import architecture_entry
from nnunetv2_meddisseg.training.errors import TrainingInputError

__all__ = ["network_class_is_meddisseg", "plans_recording_the_network", "require_2d_configuration",
           "build_meddisseg_network", "plans_encoder_weights", "load_plans_encoder_weights"]


def network_class_is_meddisseg(configuration_manager: ConfigurationManager) -> bool:
    """True when the configuration's network class is (a subclass of) MedDisSegNet, whatever the plans' name."""
    class_name = configuration_manager.network_arch_class_name
    located = locate(class_name) if isinstance(class_name, str) else None
    return isinstance(located, type) and issubclass(located, MedDisSegNet)


def plans_recording_the_network(plans: dict, configuration: str) -> dict:
    """``plans`` where ``configuration`` builds MedDisSegNet, else a copy naming it as ``nnUNetv2_meddisseg_plan`` does
    by default (``architecture_entry``), so that the plans nnU-Net saves with the model (``plans.json``, the
    checkpoints' ``init_args``) rebuild the network trained."""
    if network_class_is_meddisseg(PlansManager(deepcopy(plans)).get_configuration(configuration)):
        return plans
    recorded = deepcopy(plans)
    recorded["configurations"][configuration]["architecture"] = architecture_entry()
    return recorded


def require_2d_configuration(plans: dict, configuration: str, trainer_name: str) -> None:
    """A ``TrainingInputError`` (a ``ValueError``) naming the remedies where ``configuration`` has no 2D patch size."""
    manager = PlansManager(deepcopy(plans)).get_configuration(configuration)
    patch_size = list(manager.patch_size)
    if len(patch_size) != 2:
        raise TrainingInputError(f"{trainer_name} trains 2D networks only, but configuration '{configuration}' has "
                                 f"a {len(patch_size)}D patch size {patch_size}: use the 2d configuration (-c 2d), or "
                                 f"nnUNetTrainerDispersive for 3D.")


def build_meddisseg_network(configuration_manager: ConfigurationManager, num_input_channels: int,
                            num_output_channels: int, enable_deep_supervision: bool = True) -> nn.Module:
    """MedDisSegNet from the plans' ``arch_kwargs`` where they name it, else as ``nnUNetv2_meddisseg_plan`` writes it
    by default (``architecture_entry``); the plans' ``encoder_weights`` are never read here."""
    if network_class_is_meddisseg(configuration_manager):
        class_name = configuration_manager.network_arch_class_name
        arch_kwargs = dict(configuration_manager.network_arch_init_kwargs)
        requires_import = configuration_manager.network_arch_init_kwargs_req_import
    else:
        entry = architecture_entry()
        class_name, arch_kwargs, requires_import = (entry["network_class_name"], entry["arch_kwargs"],
                                                    entry["_kw_requires_import"])
    arch_kwargs["encoder_weights"] = None
    return get_network_from_plans(class_name, arch_kwargs, requires_import, num_input_channels,
                                  num_output_channels, allow_init=True, deep_supervision=enable_deep_supervision)


def plans_encoder_weights(configuration_manager: ConfigurationManager) -> Optional[str]:
    """The plans' ``encoder_weights`` (a file or ``imagenet``), None where they name none."""
    if not network_class_is_meddisseg(configuration_manager):
        return None
    return configuration_manager.network_arch_init_kwargs.get("encoder_weights") or None


def load_plans_encoder_weights(network: nn.Module, configuration_manager: ConfigurationManager) -> None:
    """Load the plans' ``encoder_weights``, if any, into ``network.encoder``; a missing file, one carrying code or no
    ResNet-50 state dict is a ``TrainingInputError`` naming the file and the plans' setting."""
    weights = plans_encoder_weights(configuration_manager)
    if weights is None:
        return
    try:
        path = resolve_encoder_weights(weights)
    except FileNotFoundError as error:  # 'imagenet' without the file in torch.hub's cache
        raise TrainingInputError(f"{error} (the plans' encoder_weights)") from None
    if not os.path.isfile(path):
        raise TrainingInputError(f"encoder weights file not found: {path} (the plans' encoder_weights)")
    try:
        load_resnet50_weights(network.encoder, path)
    except ValueError as error:  # UnsafeTorchFile too
        raise TrainingInputError(f"{error} (the plans' encoder_weights)") from None
