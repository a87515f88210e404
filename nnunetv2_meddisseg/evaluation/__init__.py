"""The paper's metrics, the evaluate command, and the nnU-Net vs Med-DisSeg comparison."""
from nnunetv2_meddisseg.evaluation.metrics import (
                                                   EPSILON,
                                                   binary_metrics,
                                                   dice_hd95_transunet,
                                                   hd95,
                                                   multiclass_dice_hd95,
)

__all__ = ["EPSILON", "binary_metrics", "dice_hd95_transunet", "hd95", "multiclass_dice_hd95"]
