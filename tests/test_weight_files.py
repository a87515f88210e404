"""Pickle payloads and non-finite values in the other weight files we load: the encoder file the trainer (and the
network's constructor) reads and the ablation's checkpoints are refused, a payload (``tests/payload.py``) is never
run, and no error advises loading unsafely. The plan command's encoder file is a row of the bad-input table
(tests/planning/test_plan_error_table.py), the shared model folder's checkpoints are in tests/test_sharing.py."""
from __future__ import annotations

import pytest
import torch
from bad_input_table import encoder_state_dict


def test_encoder_weights_payload_is_refused_without_unsafe_advice(tmp_path):
    """What the trainer (and the network's constructor) reports for an encoder file carrying code."""
    from payload import Payload

    from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder, load_resnet50_weights

    state = encoder_state_dict()
    state["conv1.weight"] = Payload(tmp_path / "payload_ran")
    torch.save(state, tmp_path / "encoder.pth")
    with pytest.raises(ValueError) as e:
        load_resnet50_weights(ResNet50Encoder(3), str(tmp_path / "encoder.pth"))
    message = str(e.value)
    assert message == (f"encoder weights {tmp_path / 'encoder.pth'} holds pickled objects other than tensors, numbers "
                       f"and containers (needs GLOBAL {open.__module__}.open); it was not loaded, since loading such "
                       f"objects can run code: save plain data (state_dict() and built-in types) instead")
    assert "weights_only" not in message and not (tmp_path / "payload_ran").exists()


def test_encoder_weights_with_nan_are_refused(tmp_path):
    from nnunetv2_meddisseg.blocks.encoder import ResNet50Encoder, load_resnet50_weights

    state = encoder_state_dict()
    state["bn1.running_var"][3] = float("inf")
    torch.save(state, tmp_path / "inf.pth")
    with pytest.raises(ValueError, match=r"key 'bn1.running_var' holds NaN or inf values \(expected finite weights\)"):
        load_resnet50_weights(ResNet50Encoder(3), str(tmp_path / "inf.pth"))


def test_ablation_checkpoint_payload_is_refused(tmp_path):
    """The ablation table reads the training time of each run's checkpoint."""
    import numpy as np
    from payload import Payload

    from nnunetv2_meddisseg.ablation.runs import epoch_seconds
    from nnunetv2_meddisseg.torch_files import UnsafeTorchFile

    logging = {"epoch_start_timestamps": [np.float64(1.0)], "epoch_end_timestamps": [np.float64(3.5)]}
    torch.save({"logging": logging}, tmp_path / "checkpoint_final.pth")
    assert sum(epoch_seconds(tmp_path / "checkpoint_final.pth")) == 2.5
    logging["epoch_end_timestamps"] = [Payload(tmp_path / "payload_ran")]
    torch.save({"logging": logging}, tmp_path / "checkpoint_final.pth")
    with pytest.raises(UnsafeTorchFile, match=f"needs GLOBAL {open.__module__}.open"):
        epoch_seconds(tmp_path / "checkpoint_final.pth")
    assert not (tmp_path / "payload_ran").exists()

