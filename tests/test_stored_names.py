"""Names that users' files store still load (``stored_names``): the norm classes plans files written by earlier
versions name, checkpoints that record their stage the earlier way (no
``meddisseg_stage`` entry) and that call Stage I's head group "decoder"."""
import math

import pytest
import torch
from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

from nnunetv2_meddisseg.blocks.norm import SingleKernelInstanceNorm2d, UncountedBatchNorm2d
from nnunetv2_meddisseg.plans_architecture import architecture_entry
from nnunetv2_meddisseg.stored_names import curves_with_the_head_named, head_group_named
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


def test_stage1_curves_of_the_head_group_named_decoder_move_to_head():
    curves = {"stage": [1, 1, 2], "lr_decoder": [1e-4, 5e-5, 1e-4], "grad_norm_decoder": [3.0, 2.0, 1.0],
              "lr_encoder": [1e-4, 5e-5, 1e-5]}
    curves_with_the_head_named(curves)
    assert curves["lr_head"][:2] == [1e-4, 5e-5] and math.isnan(curves["lr_head"][2])
    assert curves["grad_norm_head"][:2] == [3.0, 2.0] and curves["grad_norm_decoder"][2] == 1.0
    assert all(math.isnan(v) for v in curves["lr_decoder"][:2]) and curves["lr_encoder"] == [1e-4, 5e-5, 1e-5]
    again = {k: list(v) for k, v in curves.items()}
    curves_with_the_head_named(curves)  # curves of today: nothing to move
    assert {k: [str(x) for x in v] for k, v in curves.items()} == {k: [str(x) for x in v] for k, v in again.items()}


def test_restored_optimizer_groups_get_todays_names():
    groups = [{"name": "decoder"}, {"name": "encoder"}]
    head_group_named(groups, ("head", "encoder"))
    assert [g["name"] for g in groups] == ["head", "encoder"]
    stage2 = [{"name": "decoder"}, {"name": "encoder"}]
    head_group_named(stage2, ("decoder", "encoder"))
    assert [g["name"] for g in stage2] == ["decoder", "encoder"]
