"""The dataset-level mask report through the real command (``main``): every mask is read before anything is
written; masks the rule refuses are listed together and stop the conversion unless ``--mask_threshold T`` or
``--skip_ambiguous``, and the report of a conversion that goes through names what the rule made of the masks.

Source trees are generated like the published ones: CVC-ClinicDB's PNG re-release (``Original/N.png``,
``Ground Truth/N.png``: 0 / 255 masks, some with a faint background of 11), Kvasir-Sessile's JPEG masks.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from convert_trees import blob_mask, case_ids, random_rgb, read_png, save, write_split

from nnunetv2_meddisseg.datasets.convert import convert, main
from nnunetv2_meddisseg.datasets.mask_report import MaskRuleError
from nnunetv2_meddisseg.datasets.split_lists import load_shipped_split

PREFIX = "nnUNetv2_meddisseg_convert: error: "
SIZE = (40, 50)  # 2000 pixels: 6 % is 120
N_CASES = 50
FAINT = ("3", "11", "19", "27", "35")
AMBIGUOUS = "7"


def _region(mask: np.ndarray, value: int, fraction: float) -> np.ndarray:
    """``mask`` with ``value`` on ``fraction`` of the pixels, taken from the background of the bottom rows."""
    out = mask.copy()
    free = np.flatnonzero((out == 0).reshape(-1)[::-1])[: int(round(fraction * out.size))]
    out.reshape(-1)[out.size - 1 - free] = value
    return out


def make_cvc_png_tree(root: Path, ids=None, faint=FAINT, ambiguous=(AMBIGUOUS,), seed: int = 0) -> dict:
    """CVC-ClinicDB's PNG re-release: ``root/Original/N.png`` and ``root/Ground Truth/N.png``; masks 0 / 255,
    those in ``faint`` with 11 over 6 % of the pixels, those in ``ambiguous`` with 128 over 6 %. Returns
    {case: mask array}."""
    rng = np.random.default_rng(seed)
    masks = {}
    for case in ids or [str(i) for i in range(1, N_CASES + 1)]:
        save(random_rgb(rng, *SIZE), root / "Original" / f"{case}.png")
        mask = blob_mask(rng, *SIZE)
        if case in faint:
            mask = _region(mask, 11, 0.06)
        if case in ambiguous:
            mask = _region(mask, 128, 0.06)
        masks[case] = mask
        save(mask, root / "Ground Truth" / f"{case}.png")
    return masks


def _tree(root: Path) -> set:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def _split(tmp: Path) -> Path:
    ids = [str(i) for i in range(1, N_CASES + 1)]
    return write_split(tmp / "split.json", ids[:35], ids[35:40], ids[40:])  # case 7 is a training case


def test_faint_background_converts_and_the_report_names_it(tmp_path, nnunet_dirs, capsys):
    masks = make_cvc_png_tree(tmp_path / "cvc", ambiguous=())
    assert main(["cvc-clinicdb", str(tmp_path / "cvc"), "-d", "32", "-np", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    raw = nnunet_dirs["nnUNet_raw"] / "Dataset032_CVCClinicDB"
    for case in FAINT:
        assert (masks[case] == 11).mean() == pytest.approx(0.06)
        np.testing.assert_array_equal(read_png(raw / "labelsTs" / f"{case}.png"), masks[case] == 255)
    assert out[0] == f"masks: {N_CASES} read by the mask rule"
    assert out[1] == f"  {N_CASES - len(FAINT)} binary (0 and one value, or 0/1) kept as they are"
    assert out[2] == ("  5 with faint background values (at most 25 % of the range, over 1 % of the mask) read as "
                      "background: Ground Truth/3.png, Ground Truth/11.png, Ground Truth/19.png (2 more)")
    record = json.loads((raw / "dataset.json").read_text())["meddisseg_conversion"]["masks"]
    assert record["counts"] == {"label": N_CASES - len(FAINT), "faint": len(FAINT)}
    assert record["mask_threshold"] is None and record["left_out"] == {}


def test_one_ambiguous_mask_of_fifty_is_named_and_nothing_is_written(tmp_path, nnunet_dirs, capsys):
    make_cvc_png_tree(tmp_path / "cvc")
    split = _split(tmp_path)
    before = _tree(tmp_path)
    assert main(["cvc-clinicdb", str(tmp_path / "cvc"), "-d", "32", "--split_file", str(split), "-np", "1"]) == 2
    out, err = capsys.readouterr()
    assert _tree(tmp_path) == before  # nothing written: no dataset, no .partial folder, no splits_final.json
    mask = tmp_path / "cvc" / "Ground Truth" / f"{AMBIGUOUS}.png"
    problem = (f"mask {mask} holds the values {{0, 128, 255}}: 128 covers 6 % of the pixels, in the middle of "
               f"its range (above 63.75, below 191.25), so it is neither faint background nor an anti-aliased edge "
               f"(expected a binary mask: 0 and one foreground value)")
    assert err.strip().splitlines() == [
        f"{PREFIX}1 of {N_CASES} masks are refused by the mask rule (all listed in the report above), the first: "
        f"{problem}; pass --mask_threshold T (foreground: the mask values above T) or --skip_ambiguous (those "
        f"cases are left out and named); nothing was written"]
    lines = out.splitlines()
    assert "  1 ambiguous (a middle value covers over 1 % of the mask), refused:" in lines
    assert f"    {problem}" in lines
    assert lines[-2].startswith("  rule: masks holding 0 and one value (or 0/1) are that label; in any other mask, "
                                "values at or below 25 % of its range are background, at or above 75 % foreground")
    assert lines[-1] == ("  to go on: pass --mask_threshold T (foreground: the mask values above T) or "
                         "--skip_ambiguous (those cases are left out and named)")


def test_every_refused_mask_is_listed_together(tmp_path, nnunet_dirs, capsys):
    """Not a first-mask stop: three refused masks (two ambiguous, one empty although bright) in one report."""
    make_cvc_png_tree(tmp_path / "cvc", ids=[str(i) for i in range(1, 11)], ambiguous=("2", "9"))
    dark = np.zeros(SIZE, np.uint8)
    dark[5:9, 5:9] = 100  # 16 pixels of 100 and 11 elsewhere: empty at half the range, bright beyond the low band
    save(_region(dark, 11, 0.3), tmp_path / "cvc" / "Ground Truth" / "5.png")
    assert main(["cvc-clinicdb", str(tmp_path / "cvc"), "-d", "32", "-np", "2"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"{PREFIX}3 of 10 masks are refused") and "Ground Truth/2.png holds the values" in err
    refused = [line for line in out.splitlines() if line.startswith("    mask ")]
    assert [re.search(r"/(\d+\.png) ", line).group(1) for line in refused] == ["2.png", "5.png", "9.png"]
    assert "5.png would be written empty: its values reach 100" in refused[1]
    assert ("  2 ambiguous (a middle value covers over 1 % of the mask) and 1 that would be written empty although "
            "they hold non-zero values, refused:") in out.splitlines()
    assert _tree(nnunet_dirs["nnUNet_raw"]) == set()


def test_mask_threshold_converts_every_case_and_is_recorded(tmp_path, nnunet_dirs, capsys):
    masks = make_cvc_png_tree(tmp_path / "cvc")
    split = _split(tmp_path)
    assert main(["cvc-clinicdb", str(tmp_path / "cvc"), "-d", "32", "--split_file", str(split),
                 "--mask_threshold", "127", "-np", "1"]) == 0
    raw = nnunet_dirs["nnUNet_raw"] / "Dataset032_CVCClinicDB"
    assert len(case_ids(raw / "imagesTr")) == 40 and len(case_ids(raw / "imagesTs")) == 10
    label = read_png(raw / "labelsTr" / f"{AMBIGUOUS}.png")
    np.testing.assert_array_equal(label, masks[AMBIGUOUS] > 127)
    assert label[masks[AMBIGUOUS] == 128].all() and not label[masks[AMBIGUOUS] == 11].any()
    dataset = json.loads((raw / "dataset.json").read_text())
    assert dataset["meddisseg_conversion"]["masks"]["mask_threshold"] == 127
    assert dataset["meddisseg_conversion"]["masks"]["counts"]["middle"] == 1
    assert "masks binarised at values above 127 (--mask_threshold)" in dataset["description"]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"masks: {N_CASES} read; all but the binary ones thresholded at --mask_threshold 127"
    assert "  1 with middle values (over 1 % of the mask): Ground Truth/7.png" in out


def test_skip_ambiguous_leaves_the_case_out_of_the_dataset_and_the_split(tmp_path, nnunet_dirs, capsys):
    masks = make_cvc_png_tree(tmp_path / "cvc")
    split = _split(tmp_path)
    assert main(["cvc-clinicdb", str(tmp_path / "cvc"), "-d", "32", "--split_file", str(split),
                 "--skip_ambiguous", "-np", "1"]) == 0
    raw = nnunet_dirs["nnUNet_raw"] / "Dataset032_CVCClinicDB"
    ids = [str(i) for i in range(1, N_CASES + 1)]
    train = sorted(c for c in ids[:35] if c != AMBIGUOUS)
    assert case_ids(raw / "imagesTr") == set(train + ids[35:40]) and case_ids(raw / "imagesTs") == set(ids[40:])
    assert len(case_ids(raw / "imagesTr")) + len(case_ids(raw / "imagesTs")) == N_CASES - 1
    assert case_ids(raw / "labelsTr", channel=None) == set(train + ids[35:40])
    expected_splits = [{"train": train, "val": sorted(ids[35:40])}]
    assert json.loads((raw / "splits_final.json").read_text()) == expected_splits
    prep = nnunet_dirs["nnUNet_preprocessed"] / raw.name / "splits_final.json"
    assert json.loads(prep.read_text()) == expected_splits
    dataset = json.loads((raw / "dataset.json").read_text())
    assert dataset["numTraining"] == 39
    record = dataset["meddisseg_conversion"]
    assert list(record["masks"]["left_out"]) == [AMBIGUOUS] and record["num_train"] == 34
    assert "left out for their masks (--skip_ambiguous): 1 cases" in record["split"]
    out = capsys.readouterr().out
    assert "  1 ambiguous (a middle value covers over 1 % of the mask), left out (--skip_ambiguous):" in out
    assert f"Ground Truth/{AMBIGUOUS}.png holds the values" in out
    for case in FAINT:  # the faint-background cases are in, their faint pixels background
        folder = "labelsTr" if case in ids[:40] else "labelsTs"
        np.testing.assert_array_equal(read_png(raw / folder / f"{case}.png"), masks[case] == 255)


def test_skip_ambiguous_adjusts_a_shipped_split(tmp_path, nnunet_dirs, capsys):
    """Kvasir-Sessile's shipped 156 / 20 / 20 lists: a JPEG mask drawn too dark (it would come out empty) is
    left out of its list, every other case keeps its own."""
    shipped = load_shipped_split("kvasir_sessile.json")
    root = tmp_path / "sessile-main-Kvasir-SEG"
    rng = np.random.default_rng(1)
    for case in shipped["train"] + shipped["val"] + shipped["test"]:
        save(random_rgb(rng, 16, 16), root / "images" / f"{case}.jpg")
        save(blob_mask(rng, 16, 16), root / "masks" / f"{case}.jpg", quality=95)
    dark = shipped["val"][3]
    save((blob_mask(rng, 16, 16) > 0).astype(np.uint8) * 100, root / "masks" / f"{dark}.jpg", quality=100)
    argv = ["kvasir-sessile", str(tmp_path), "-d", "33", "-np", "1"]
    assert main(argv) == 2
    assert f"masks/{dark}.jpg would be written empty" in capsys.readouterr().err
    assert _tree(nnunet_dirs["nnUNet_raw"]) == set()
    assert main([*argv, "--skip_ambiguous"]) == 0
    raw = nnunet_dirs["nnUNet_raw"] / "Dataset033_KvasirSessile"
    splits = json.loads((raw / "splits_final.json").read_text())
    assert splits == [{"train": sorted(shipped["train"]), "val": sorted(c for c in shipped["val"] if c != dark)}]
    assert case_ids(raw / "imagesTs") == set(shipped["test"])
    assert len(case_ids(raw / "imagesTr")) == 175


def test_label_maps_and_faint_only_masks_are_listed_and_skip_ambiguous_leaves_them_out(tmp_path, nnunet_dirs, capsys):
    """A 0/1/2 label map and a foreground drawn at 40 with a soft edge: both would have been written as background;
    both are listed (a threshold cannot make the label map binary), and --skip_ambiguous leaves both cases out."""
    masks = make_cvc_png_tree(tmp_path / "cvc", ids=[str(i) for i in range(1, 9)], faint=(), ambiguous=())
    label_map = np.zeros(SIZE, np.uint8)
    label_map[2:12, 5:45], label_map[20:30, 5:45] = 1, 2
    save(label_map, tmp_path / "cvc" / "Ground Truth" / "3.png")
    faint = np.where(masks["6"] > 0, 40, 0).astype(np.uint8)
    edge = np.flatnonzero(((np.roll(masks["6"], 1, axis=0) > 0) != (masks["6"] > 0)).reshape(-1))
    faint.reshape(-1)[edge[:12]] = 20  # a soft edge (under 1 % of the pixels): three values
    save(faint, tmp_path / "cvc" / "Ground Truth" / "6.png")
    argv = ["cvc-clinicdb", str(tmp_path / "cvc"), "-d", "32", "-np", "1"]
    for extra, refused in (([], 2), (["--mask_threshold", "1"], 1)):  # T = 1 makes the faint mask's 20 and 40 count
        assert main([*argv, *extra]) == 2
        out, err = capsys.readouterr()
        assert err.startswith(f"{PREFIX}{refused} of 8 masks are refused by the mask rule")
        assert "Ground Truth/3.png holds the values {0, 1, 2}: 1, 2 each cover more than 1 % of the pixels" in out
        assert "1 holding more classes than the dataset's two (label maps)" in out
        assert ("Ground Truth/6.png would be written empty" in out) == (refused == 2)
        assert _tree(nnunet_dirs["nnUNet_raw"]) == set()
    assert main([*argv, "--skip_ambiguous"]) == 0
    raw = nnunet_dirs["nnUNet_raw"] / "Dataset032_CVCClinicDB"
    assert case_ids(raw / "imagesTs") == {"1", "2", "4", "5", "7", "8"}
    record = json.loads((raw / "dataset.json").read_text())["meddisseg_conversion"]["masks"]
    assert sorted(record["left_out"]) == ["3", "6"] and "a label map of 3 classes" in record["left_out"]["3"]
    assert record["left_out"]["6"].endswith("would be written empty: its values reach 40 ({0, 20, 40}) but none "
                                            "exceeds half its range (127.5); expected a binary mask with foreground "
                                            "above that")


def test_the_python_api_raises_with_the_whole_report(tmp_path, nnunet_dirs):
    make_cvc_png_tree(tmp_path / "cvc", ids=[str(i) for i in range(1, 6)], ambiguous=("4",))
    with pytest.raises(MaskRuleError) as e:
        convert("cvc-clinicdb", tmp_path / "cvc", 32)
    assert e.value.report.refused == ["4"] and e.value.report.counts()["faint"] == 1
    assert _tree(nnunet_dirs["nnUNet_raw"]) == set()


@pytest.mark.parametrize("value, expected", [
    ("-1", "--mask_threshold must be a number from 0 to below 65535 (foreground: the mask values above it, e.g. 127 "
           "for 8-bit masks), got -1.0"),
    ("nan", "got nan"),
    ("255", "--mask_threshold 255 is not below the range of mask "),
])
def test_bad_mask_threshold_is_one_line_and_writes_nothing(tmp_path, nnunet_dirs, capsys, value, expected):
    make_cvc_png_tree(tmp_path / "cvc", ids=["1", "2", "3"], faint=("2",), ambiguous=())
    before = _tree(tmp_path)
    assert main(["cvc-clinicdb", str(tmp_path / "cvc"), "-d", "32", "--mask_threshold", value, "-np", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX) and expected in lines[0], lines
    assert _tree(tmp_path) == before


def test_mask_threshold_is_refused_for_instance_labels(tmp_path, nnunet_dirs, capsys):
    from convert_trees import make_pairs

    folder = tmp_path / "Warwick QU Dataset (Released 2016_07_08)"
    make_pairs(folder, folder, ["train_1", "train_2", "testA_1"], ".bmp", ".bmp", mask_tag="_anno", instance=True)
    assert main(["glas", str(tmp_path), "-d", "34", "--mask_threshold", "127", "-np", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"{PREFIX}--mask_threshold applies to binary masks only: GlaS's labels are read as they are "
                   f"(instance or organ labels)")
    assert _tree(nnunet_dirs["nnUNet_raw"]) == set()
