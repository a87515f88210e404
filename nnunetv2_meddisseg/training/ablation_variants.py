"""The paper's ablations of Med-DisSeg as ready-made trainer variants (``nnUNetTrainerMedDisSeg_<what>``).

Each variant changes one thing of ``nnUNetTrainerMedDisSeg`` and keeps the rest:

- dispersive loss per stage: ``_dispersiveStage1Only`` / ``_dispersiveStage2Only`` (the other
  stage's weight set to 0; ``_noDispersive``, both 0, lives in ``variants.py``);
- the loss variant: ``_infonceL2`` (the default, named for tables), ``_cosine``, ``_hinge``,
  ``_covariance``;
- the placement: ``_early`` (the default), ``_middle``, ``_late``, ``_allLayers`` (mean of the three);
- the temperature: ``_tau0p1``, ``_tau0p5``, ``_tau0p8`` (the default), ``_tau1p0``;
- the Stage II weight lambda2: ``_lambda0p2``, ``_lambda0p6`` (the default), ``_lambda1p0``;
- the network (``build_network_architecture``, the same at training and prediction): ``_noELAT``
  (identity instead of ELAT), ``_ReLU`` (ReLU instead of TeLU in every block Med-DisSeg adds),
  ``_noCBAT`` (each decoding path ends in a plain 3x3 conv-norm-activation block of the same width
  instead of CBAT);
- the schedule: ``_noStage1`` (Stage II from the first epoch, no encoder pre-training).

The network variants change only the option they name: with Med-DisSeg plans
(``nnUNetMedDisSegPlans``) the plans' other ``arch_kwargs`` are kept, with nnU-Net's default plans
the other arguments are MedDisSegNet's defaults. The same network options also exist as plans
(``nnUNetv2_meddisseg_plan --no-elat / --activation relu / --no-cbat``).
"""
from copy import deepcopy

from torch import nn

from nnunetv2.utilities.plans_handling.plans_handler import ConfigurationManager, PlansManager

from nnunetv2_meddisseg.planning.plan_meddisseg import NETWORK_CLASS_NAME, default_arch_kwargs
from nnunetv2_meddisseg.training.nnUNetTrainerMedDisSeg import nnUNetTrainerMedDisSeg, network_class_is_meddisseg

__all__ = [
    "build_meddisseg_network",
    "nnUNetTrainerMedDisSeg_dispersiveStage1Only", "nnUNetTrainerMedDisSeg_dispersiveStage2Only",
    "nnUNetTrainerMedDisSeg_infonceL2", "nnUNetTrainerMedDisSeg_cosine", "nnUNetTrainerMedDisSeg_hinge",
    "nnUNetTrainerMedDisSeg_covariance",
    "nnUNetTrainerMedDisSeg_early", "nnUNetTrainerMedDisSeg_middle", "nnUNetTrainerMedDisSeg_late",
    "nnUNetTrainerMedDisSeg_allLayers",
    "nnUNetTrainerMedDisSeg_tau0p1", "nnUNetTrainerMedDisSeg_tau0p5", "nnUNetTrainerMedDisSeg_tau0p8",
    "nnUNetTrainerMedDisSeg_tau1p0",
    "nnUNetTrainerMedDisSeg_lambda0p2", "nnUNetTrainerMedDisSeg_lambda0p6", "nnUNetTrainerMedDisSeg_lambda1p0",
    "nnUNetTrainerMedDisSeg_noELAT", "nnUNetTrainerMedDisSeg_ReLU", "nnUNetTrainerMedDisSeg_noCBAT",
    "nnUNetTrainerMedDisSeg_noStage1",
]


def build_meddisseg_network(plans_manager: PlansManager, configuration_manager: ConfigurationManager,
                            num_input_channels: int, num_output_channels: int, enable_deep_supervision: bool,
                            **overrides) -> nn.Module:
    """``nnUNetTrainerMedDisSeg.build_network_architecture`` with some MedDisSegNet arguments replaced.

    Plans naming MedDisSegNet keep their other ``arch_kwargs``; other plans (nnU-Net's default)
    get MedDisSegNet's defaults (:func:`default_arch_kwargs`) plus ``overrides``.
    """
    configuration = deepcopy(configuration_manager.configuration)
    if network_class_is_meddisseg(configuration_manager):
        configuration["architecture"]["arch_kwargs"].update(overrides)
    else:
        configuration["architecture"] = {"network_class_name": NETWORK_CLASS_NAME,
                                         "arch_kwargs": default_arch_kwargs(**overrides),
                                         "_kw_requires_import": ["conv_op", "norm_op"]}
    return nnUNetTrainerMedDisSeg.build_network_architecture(
        plans_manager, ConfigurationManager(configuration), num_input_channels, num_output_channels,
        enable_deep_supervision)


# ------------------------------------------------------------------ dispersive loss per stage
class nnUNetTrainerMedDisSeg_dispersiveStage1Only(nnUNetTrainerMedDisSeg):
    """Dispersive loss in Stage I only (the paper's Disp-I row)."""

    lambda_dispersive_stage2 = 0.0


class nnUNetTrainerMedDisSeg_dispersiveStage2Only(nnUNetTrainerMedDisSeg):
    """Dispersive loss in Stage II only (the paper's Disp-II row)."""

    lambda_dispersive_stage1 = 0.0


# ------------------------------------------------------------------ loss variant
class nnUNetTrainerMedDisSeg_infonceL2(nnUNetTrainerMedDisSeg):
    """InfoNCE on squared L2 distances (the default, named for ablation tables)."""

    dispersive_variant = "infonce_l2"


class nnUNetTrainerMedDisSeg_cosine(nnUNetTrainerMedDisSeg):
    """InfoNCE on cosine dissimilarities."""

    dispersive_variant = "infonce_cosine"


class nnUNetTrainerMedDisSeg_hinge(nnUNetTrainerMedDisSeg):
    """Hinge loss on pairwise distances."""

    dispersive_variant = "hinge"


class nnUNetTrainerMedDisSeg_covariance(nnUNetTrainerMedDisSeg):
    """Off-diagonal covariance penalty."""

    dispersive_variant = "covariance"


# ------------------------------------------------------------------ placement
class nnUNetTrainerMedDisSeg_early(nnUNetTrainerMedDisSeg):
    """Dispersive loss on the ELAT-refined layer-1 output x2 (the default, named for ablation tables)."""

    dispersive_placement = "early"


class nnUNetTrainerMedDisSeg_middle(nnUNetTrainerMedDisSeg):
    """Dispersive loss on the ELAT-refined bottleneck x4."""

    dispersive_placement = "middle"


class nnUNetTrainerMedDisSeg_late(nnUNetTrainerMedDisSeg):
    """Dispersive loss on the last feature before the logits (D_s; the Stage I head's fused feature)."""

    dispersive_placement = "late"


class nnUNetTrainerMedDisSeg_allLayers(nnUNetTrainerMedDisSeg):
    """Dispersive loss averaged over the early, middle and late placements."""

    dispersive_placement = "all"


# ------------------------------------------------------------------ temperature
class nnUNetTrainerMedDisSeg_tau0p1(nnUNetTrainerMedDisSeg):
    dispersive_tau = 0.1


class nnUNetTrainerMedDisSeg_tau0p5(nnUNetTrainerMedDisSeg):
    dispersive_tau = 0.5


class nnUNetTrainerMedDisSeg_tau0p8(nnUNetTrainerMedDisSeg):
    """The default temperature, named for ablation tables."""

    dispersive_tau = 0.8


class nnUNetTrainerMedDisSeg_tau1p0(nnUNetTrainerMedDisSeg):
    dispersive_tau = 1.0


# ------------------------------------------------------------------ Stage II weight
class nnUNetTrainerMedDisSeg_lambda0p2(nnUNetTrainerMedDisSeg):
    """lambda2 (Stage II dispersive weight) 0.2; Stage I keeps 0.2."""

    lambda_dispersive_stage2 = 0.2


class nnUNetTrainerMedDisSeg_lambda0p6(nnUNetTrainerMedDisSeg):
    """lambda2 0.6 (the default, named for ablation tables)."""

    lambda_dispersive_stage2 = 0.6


class nnUNetTrainerMedDisSeg_lambda1p0(nnUNetTrainerMedDisSeg):
    """lambda2 1.0; Stage I keeps 0.2."""

    lambda_dispersive_stage2 = 1.0


# ------------------------------------------------------------------ network
class nnUNetTrainerMedDisSeg_noELAT(nnUNetTrainerMedDisSeg):
    """Identity instead of ELAT on the four encoder outputs (the paper's "w/o ELAT")."""

    @staticmethod
    def build_network_architecture(plans_manager: PlansManager,
                                   configuration_manager: ConfigurationManager,
                                   num_input_channels: int,
                                   num_output_channels: int,
                                   enable_deep_supervision: bool = True) -> nn.Module:
        return build_meddisseg_network(plans_manager, configuration_manager, num_input_channels,
                                       num_output_channels, enable_deep_supervision, elat=False)


class nnUNetTrainerMedDisSeg_ReLU(nnUNetTrainerMedDisSeg):
    """ReLU instead of TeLU in every block Med-DisSeg adds (the ResNet-50 keeps its ReLU anyway)."""

    @staticmethod
    def build_network_architecture(plans_manager: PlansManager,
                                   configuration_manager: ConfigurationManager,
                                   num_input_channels: int,
                                   num_output_channels: int,
                                   enable_deep_supervision: bool = True) -> nn.Module:
        return build_meddisseg_network(plans_manager, configuration_manager, num_input_channels,
                                       num_output_channels, enable_deep_supervision, activation="relu")


class nnUNetTrainerMedDisSeg_noCBAT(nnUNetTrainerMedDisSeg):
    """Each decoding path ends in a plain CBT3x3 block (3x3 conv 128 -> 128, the plans' normalisation and
    activation) instead of CBAT (the paper's "w/o CBAT")."""

    @staticmethod
    def build_network_architecture(plans_manager: PlansManager,
                                   configuration_manager: ConfigurationManager,
                                   num_input_channels: int,
                                   num_output_channels: int,
                                   enable_deep_supervision: bool = True) -> nn.Module:
        return build_meddisseg_network(plans_manager, configuration_manager, num_input_channels,
                                       num_output_channels, enable_deep_supervision, cbat=False)


# ------------------------------------------------------------------ schedule
class nnUNetTrainerMedDisSeg_noStage1(nnUNetTrainerMedDisSeg):
    """No Stage I: the full network trains in Stage II from the first epoch, for the same number of epochs."""

    stage1_fraction = 0.0
