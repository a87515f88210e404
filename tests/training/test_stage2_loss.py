import pytest
import torch

from nnunetv2_meddisseg.architectures import MedDisSegOutput
from nnunetv2_meddisseg.losses import DispersiveLoss
from nnunetv2_meddisseg.training.objectives import Stage2Loss, Stage2Weights, segmentation_loss


def _output(seed: int) -> MedDisSegOutput:
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: (torch.randn(*shape, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    paths = tuple(r(3, 3, 8, 8) for _ in range(3))
    return MedDisSegOutput(logits=r(3, 3, 8, 8), path_logits=paths, fg=r(3, 1, 8, 8), bg=r(3, 1, 8, 8),
                           uc=r(3, 1, 8, 8), features={k: r(3, 4, 2, 2) for k in ("early", "middle", "late")})


@pytest.mark.parametrize("batch_dice,ignore_label", [(True, None), (False, None), (True, 3)])
def test_one_pass_over_the_four_maps_equals_the_loss_called_per_map(batch_dice, ignore_label):
    """Stage2Loss scores the four maps in one pass where the loss is nnU-Net's Dice + CE; a loss it does not
    recognise (here the same loss behind a function) is called per map: same terms, same gradients."""
    seg = segmentation_loss(batch_dice, ignore_label)
    generator = torch.Generator().manual_seed(9)
    target = torch.randint(0, 4 if ignore_label else 3, (3, 1, 8, 8), generator=generator).double()
    weights = Stage2Weights(path_supervision=0.5, fg_bg=1.0, complementarity=0.3, dispersive=0.6)
    results = []
    for loss in (seg, lambda o, t: seg(o, t)):
        output = _output(0)
        total, terms = Stage2Loss(loss, DispersiveLoss(placement="all"), weights, ignore_label).terms(output, target)
        total.backward()
        grads = [output.logits.grad] + [p.grad for p in output.path_logits]
        results.append((total, terms, grads))
    (total_a, terms_a, grads_a), (total_b, terms_b, grads_b) = results
    assert terms_a.keys() == terms_b.keys() == {"seg", "seg_paths", "fg_bg", "complementarity", "dispersive"}
    for key in terms_a:
        torch.testing.assert_close(terms_a[key].double(), terms_b[key].double(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total_a.double(), total_b.double(), rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_without_path_supervision_the_paths_are_not_scored():
    seg = segmentation_loss(True, None)
    target = torch.randint(0, 3, (3, 1, 8, 8)).double()
    weights = Stage2Weights(path_supervision=0.0, fg_bg=1.0, complementarity=0.3, dispersive=0.0)
    output = _output(1)
    total, terms = Stage2Loss(seg, None, weights).terms(output, target)
    assert "seg_paths" not in terms and "dispersive" not in terms
    total.backward()
    assert all(p.grad is None for p in output.path_logits)
    torch.testing.assert_close(terms["seg"], seg(output.logits, target))
