"""The guard of refactors: a seeded smoke training of each trainer against the record in ``equivalence_record.json``.

``equivalence_run.py`` trains ``nnUNetTrainerMedDisSeg_smoke`` (Stage I, the switch, Stage II, validation, the final
validation) and ``nnUNetTrainerDispersive_smoke`` on the shared synthetic dataset, seeded, on one CPU thread. With
the torch version and CPU kernels of the record, every loss, the final weights' sha256 and the final validation's
Dice must be identical: a change that was meant to move no number moved none. Elsewhere (another torch or CPU,
whose kernels round differently) the losses must agree to 1e-3 and the checksum is not compared.

To record anew (only for a change that is meant to change the numbers, and say so in its commit):
``NNUNETV2_MEDDISSEG_RECORD_EQUIVALENCE=1 pytest tests/training/test_training_equivalence.py``.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

RECORD = Path(__file__).with_name("equivalence_record.json")
RUN = Path(__file__).with_name("equivalence_run.py")
TRAINERS = ("nnUNetTrainerMedDisSeg_smoke", "nnUNetTrainerDispersive_smoke")
RECORD_VARIABLE = "NNUNETV2_MEDDISSEG_RECORD_EQUIVALENCE"

pytestmark = pytest.mark.e2e


def seeded_run(env: dict, trainer: str) -> dict:
    run_env = {**env, "nnUNet_meddisseg_seed": "3", "nnUNet_results": str(Path(env["nnUNet_results"]) / "equivalence")}
    proc = subprocess.run([sys.executable, str(RUN), "501", trainer], env=run_env, capture_output=True, text=True,
                          timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("EQUIVALENCE ")][-1]
    return json.loads(line[len("EQUIVALENCE "):])


@pytest.mark.parametrize("trainer", TRAINERS)
def test_seeded_smoke_training_matches_the_record(preprocessed_synthetic, trainer):
    result = seeded_run(preprocessed_synthetic, trainer)
    if os.environ.get(RECORD_VARIABLE) == "1":
        record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        record[trainer] = result
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
        pytest.skip(f"recorded {trainer} in {RECORD.name}")
    expected = json.loads(RECORD.read_text())[trainer]
    assert len(result["train_losses"]) == len(expected["train_losses"]) > 0
    assert len(result["val_losses"]) == len(expected["val_losses"]) > 0
    same_kernels = (result["torch"], result["cpu_capability"]) == (expected["torch"], expected["cpu_capability"])
    if same_kernels:
        assert result["train_losses"] == expected["train_losses"]
        assert result["val_losses"] == expected["val_losses"]
        assert result["final_validation_dice"] == expected["final_validation_dice"]
        assert result["weights_sha256"] == expected["weights_sha256"]
    else:
        for key in ("train_losses", "val_losses"):
            torch.testing.assert_close(torch.tensor(result[key]), torch.tensor(expected[key]), rtol=1e-3, atol=1e-4)
