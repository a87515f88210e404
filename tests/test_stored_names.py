"""Names that users' files store still load: the norm classes plans files written by earlier versions name, and
checkpoints that record their stage the earlier way (no ``meddisseg_stage`` entry)."""
import pytest
import torch
from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

from nnunetv2_meddisseg.blocks.norm import SingleKernelInstanceNorm2d, UncountedBatchNorm2d
from nnunetv2_meddisseg.plans_entry import architecture_entry
from nnunetv2_meddisseg.training.stages import STAGE_1, STAGE_2, checkpoint_stage


@pytest.mark.parametrize("stored, added, expected", [
    ("nnunetv2_meddisseg.blocks.norm.BatchNorm2d", "nnunetv2_meddisseg.blocks.norm.InstanceNorm2d",
     (UncountedBatchNorm2d, SingleKernelInstanceNorm2d)),
])
def test_plans_naming_the_earlier_norm_classes_build_the_network(stored, added, expected):
    entry = architecture_entry()
    kwargs = dict(entry["arch_kwargs"], norm_op=stored, added_norm_op=added, encoder_weights=None)
    assert {"norm_op", "added_norm_op"} <= set(entry["_kw_requires_import"])
    network = get_network_from_plans(entry["network_class_name"], kwargs, entry["_kw_requires_import"], 3, 2,
                                     allow_init=True, deep_supervision=False)
    kinds = {type(m) for m in network.modules()}
    assert expected[0] in kinds and expected[1] in kinds
    assert network.eval()(torch.zeros(1, 3, 32, 32)).shape == (1, 2, 32, 32)


def test_checkpoints_without_a_stage_entry_are_read_by_their_head():
    assert checkpoint_stage({"stage1_head_weights": {}}) == STAGE_1
    assert checkpoint_stage({}) == STAGE_2
    assert checkpoint_stage({"meddisseg_stage": STAGE_2}) == STAGE_2
    with pytest.raises(ValueError, match="without 'stage1_head_weights'"):
        checkpoint_stage({"meddisseg_stage": STAGE_1})
