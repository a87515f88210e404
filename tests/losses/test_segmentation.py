import pytest
import torch
from nnunetv2.training.loss.compound_losses import DC_and_CE_loss
from nnunetv2.training.loss.dice import MemoryEfficientSoftDiceLoss, SoftDiceLoss

from nnunetv2_meddisseg.losses.segmentation import dice_ce_per_output, dice_ce_settings
from nnunetv2_meddisseg.training.objectives import segmentation_loss


def _case(classes: int, seed: int, ignore_label=None, ignored_share: float = 0.3):
    gen = torch.Generator().manual_seed(seed)
    outputs = [torch.randn(3, classes, 6, 7, generator=gen, dtype=torch.float64) * 2 for _ in range(4)]
    target = torch.randint(0, classes, (3, 1, 6, 7), generator=gen).double()
    if ignore_label is not None:
        target[torch.rand(target.shape, generator=gen) < ignored_share] = ignore_label
    return outputs, target


@pytest.mark.parametrize("batch_dice", [True, False])
@pytest.mark.parametrize("classes,ignore_label,ignored_share",
                         [(2, None, 0.0), (3, None, 0.0), (3, 3, 0.3), (2, 2, 1.0)])
def test_equals_nnunet_loss_per_output_values_and_gradients(batch_dice, classes, ignore_label, ignored_share):
    outputs, target = _case(classes, 0, ignore_label, ignored_share)
    nnunet = segmentation_loss(batch_dice, ignore_label)
    settings = dice_ce_settings(nnunet)
    assert settings == dict(batch_dice=batch_dice, do_bg=False, smooth=1e-5, weight_ce=1.0, weight_dice=1.0,
                            ignore_label=ignore_label)
    ours_in = [o.clone().requires_grad_() for o in outputs]
    theirs_in = [o.clone().requires_grad_() for o in outputs]
    ours = dice_ce_per_output(ours_in, target, **settings)
    theirs = torch.stack([nnunet(o, target) for o in theirs_in]).float()
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    weights = torch.tensor([1.0, 0.2, 0.3, 0.5])
    (ours * weights).sum().backward()
    (theirs * weights).sum().backward()
    for a, b in zip(ours_in, theirs_in):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)


def test_hand_computed_two_pixels():
    # one sample, two pixels, two classes; logits 0 -> p = 1/2 everywhere
    logits = torch.zeros(1, 2, 1, 2)
    target = torch.tensor([1.0, 0.0]).view(1, 1, 1, 2)
    # CE = log 2; Dice of class 1: I = 1/2, G = 1, S = 1 -> (1 + s) / (2 + s)
    s = 1e-5
    value = dice_ce_per_output([logits], target, batch_dice=False, smooth=s)
    assert value.item() == pytest.approx(torch.log(torch.tensor(2.0)).item() - (1 + s) / (2 + s), abs=1e-6)


def test_settings_of_other_losses_are_none():
    assert dice_ce_settings(torch.nn.CrossEntropyLoss()) is None
    assert dice_ce_settings(DC_and_CE_loss({"batch_dice": True, "do_bg": False, "smooth": 1e-5}, {},
                                           dice_class=SoftDiceLoss)) is None
    smoothed = DC_and_CE_loss({"batch_dice": True, "do_bg": False, "smooth": 1e-5}, {"label_smoothing": 0.1},
                              dice_class=MemoryEfficientSoftDiceLoss)
    assert dice_ce_settings(smoothed) is None
    # batch Dice summed over processes: only nnU-Net's own loss does that
    assert dice_ce_settings(segmentation_loss(True, None, ddp=True)) is None
    assert dice_ce_settings(segmentation_loss(False, None, ddp=True)) is not None


def test_compiled_dice_module_is_recognised():
    loss = segmentation_loss(True, None)
    loss.dc = torch.compile(loss.dc)
    assert dice_ce_settings(loss) is not None


def test_no_output_is_an_error():
    with pytest.raises(ValueError, match="no outputs"):
        dice_ce_per_output([], torch.zeros(1, 1, 2, 2), batch_dice=True)
