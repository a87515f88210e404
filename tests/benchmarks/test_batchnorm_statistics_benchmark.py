"""benchmarks/batchnorm_statistics.py: drift per part and the per-image Dice, on hand-made inputs."""
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import batchnorm_statistics  # noqa: E402


def _state(mean, var, tracked=1):
    return {"mean": torch.tensor(mean), "var": torch.tensor(var), "tracked": torch.tensor(tracked)}


def test_drift_per_part_by_hand():
    running = {"network.encoder.layer1.0.bn1": _state([1.0, 0.0], [4.0, 1.0]),
               "network.cdfa.0.norm": _state([0.0], [1.0]),
               "network.decoder.0.norm": _state([5.0], [1.0])}
    estimated = {"network.encoder.layer1.0.bn1": _state([0.0, 0.0], [4.0, 1.0]),
                 "network.cdfa.0.norm": _state([0.0], [math.e ** 2]),
                 "network.decoder.0.norm": _state([0.0], [1.0], tracked=0)}  # not reached: left out
    drift = batchnorm_statistics.drift(running, estimated)
    assert set(drift) == {"encoder.layer1", "cdfa"}
    # channel 0: |1 - 0| / sqrt(4 + 1e-5) ~ 0.5, channel 1: 0 -> mean 0.25
    assert abs(drift["encoder.layer1"]["mean_shift"] - 0.25) < 1e-5
    assert abs(drift["encoder.layer1"]["log_var_ratio"]) < 1e-9
    assert abs(drift["cdfa"]["log_var_ratio"] - 2.0) < 1e-4
    assert batchnorm_statistics.part_of("head.projections.0.norm") == "Stage I head"


def test_mean_dice_counts_empty_pairs_as_agreement():
    logits = torch.zeros(2, 2, 2, 2)
    logits[0, 1, 0, :] = 1.0  # image 0 predicts the top row
    labels = np.zeros((2, 2, 2), dtype=np.uint8)
    labels[0, :, 0] = 1  # image 0's reference is the left column: overlap 1 of 2 + 2
    assert abs(batchnorm_statistics.mean_dice(logits, labels) - (0.5 + 1.0) / 2) < 1e-9
