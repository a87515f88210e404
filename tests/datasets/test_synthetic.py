"""The generated dataset (datasets/synthetic.py) is written whole, beside no fixed temporary name."""
import pytest
from planted import KINDS, plant, snapshot

from nnunetv2_meddisseg.datasets.synthetic import make_synthetic_dataset


@pytest.mark.parametrize("name", [".Dataset503_SyntheticPolyps.partial", ".Dataset503_SyntheticPolyps.old"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_folder_or_link_of_a_fixed_temporary_name_is_left_alone(tmp_path, name, kind):
    raw = tmp_path / "raw"
    raw.mkdir()
    plant(raw / name, kind, tmp_path / "outside")
    target = raw / "Dataset503_SyntheticPolyps"
    before = snapshot(tmp_path, leave_out=[target])
    for seed in (0, 1):  # written, then replaced
        assert make_synthetic_dataset(raw, dataset_id=503, num_train=1, num_test=1, size=16, seed=seed,
                                      overwrite=True) == target
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        "dataset.json", "imagesTr", "imagesTr/synth_tr_000_0000.png", "imagesTs", "imagesTs/synth_ts_000_0000.png",
        "labelsTr", "labelsTr/synth_tr_000.png", "labelsTs", "labelsTs/synth_ts_000.png"]
    assert snapshot(tmp_path, leave_out=[target]) == before  # untouched, and no temporary left
