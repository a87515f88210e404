"""benchmarks/params_flops.py counts on the meta device (nothing computed): every block must run there."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import params_flops  # noqa: E402


def test_meddisseg_flops_are_counted_on_the_meta_device():
    from nnunetv2_meddisseg.architectures import MedDisSegNet

    with torch.device("meta"):
        net = MedDisSegNet(3, 2)
    total, per_module = params_flops.count_flops(net, torch.empty(1, 3, 64, 64, device="meta"), training=False)
    assert total > 0 and per_module["MedDisSegNet.cdfa.0"] > 0
