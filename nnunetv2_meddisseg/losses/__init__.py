"""Loss functions of Med-DisSeg: the dispersive regulariser and the contrast / consistency terms."""
from nnunetv2_meddisseg.losses.contrast import (
                                                complementarity_loss,
                                                consistency_loss,
                                                dice_bce_loss,
                                                foreground_background_loss,
                                                soft_dice_loss,
)
from nnunetv2_meddisseg.losses.dispersive import (
                                                DIAGNOSTIC_KEYS,
                                                DISPERSIVE_PLACEMENTS,
                                                DISPERSIVE_VARIANTS,
                                                MINIMUM_BATCH,
                                                DispersiveLoss,
                                                dispersion_diagnostics,
                                                dispersive_loss,
)
from nnunetv2_meddisseg.losses.gather import gather_batch

__all__ = ["dispersive_loss", "DispersiveLoss", "dispersion_diagnostics", "DIAGNOSTIC_KEYS", "DISPERSIVE_VARIANTS",
           "DISPERSIVE_PLACEMENTS", "MINIMUM_BATCH", "gather_batch",
           "foreground_background_loss", "complementarity_loss", "consistency_loss", "dice_bce_loss",
           "soft_dice_loss"]
