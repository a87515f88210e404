import csv
import json
import os
import re

import numpy as np
import pytest
import SimpleITK as sitk
import torch
from PIL import Image
from scipy import stats

from nnunetv2_meddisseg.evaluation import compare_predictions
from nnunetv2_meddisseg.evaluation.compare_models import main
from nnunetv2_meddisseg.evaluation.compare_predictions import compare_prediction_folders, terminal_text
from nnunetv2_meddisseg.evaluation.nnunet_prediction import predict_missing_cases
from nnunetv2_meddisseg.evaluation.paired_statistics import wilcoxon_p_value
from nnunetv2_meddisseg.evaluation.paper_reference import load_paper_results, normalise_name, paper_reference

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# reference: a 10x10 square (100 px); model A loses K_A[i] pixels of it, model B K_B[i]
K_A = [10, 20, 5, 30, 0, 12, 25]
K_B = [5, 5, 5, 2, 8, 1, 30]


def dice_after_removing(k, n=100):
    return 2 * (n - k) / (2 * n - k)


def _write_png(path, arr):
    Image.fromarray(np.asarray(arr, dtype=np.uint8)).save(path)


def _remove_pixels(mask, k):
    out = mask.copy()
    idx = np.argwhere(out)[:k]
    out[tuple(idx.T)] = 0
    return out


@pytest.fixture
def png_folders(tmp_path):
    ref, a, b, img = (tmp_path / n for n in ("labelsTs", "pred_a", "pred_b", "imagesTs"))
    for d in (ref, a, b, img):
        d.mkdir()
    rng = np.random.default_rng(0)
    for i, (ka, kb) in enumerate(zip(K_A, K_B)):
        g = np.zeros((24, 24), np.uint8)
        g[5:15, 7:17] = 1
        case = f"case_{i:03d}"
        _write_png(ref / f"{case}.png", g)
        _write_png(a / f"{case}.png", _remove_pixels(g, ka))
        _write_png(b / f"{case}.png", _remove_pixels(g, kb))
        _write_png(img / f"{case}_0000.png", rng.integers(0, 255, (24, 24, 3)))
    return ref, a, b, img


def _is_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        return im.size[0] > 50 and im.size[1] > 50


def test_compare_prediction_folders(png_folders, tmp_path):
    ref, a, b, img = png_folders
    out = tmp_path / "out"
    r = compare_prediction_folders(str(ref), str(a), str(b), str(out), image_dir=str(img),
                                   paper_key="Dataset501_KvasirSEG", num_overlays=3, progress=False)
    assert r["paper_key"] == "KvasirSEG"
    # table rows: both models and the paper's reference row
    with open(r["files"]["table_csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["method"] for row in rows] == ["nnU-Net", "Med-DisSeg", "Med-DisSeg (paper, KvasirSEG)"]
    assert list(rows[0].keys()) == ["method", "source", "n_cases", "iou", "iou_std", "dice", "dice_std",
                                    "recall", "recall_std", "precision", "precision_std"]
    dice_a = [dice_after_removing(k) for k in K_A]
    dice_b = [dice_after_removing(k) for k in K_B]
    assert float(rows[0]["dice"]) == pytest.approx(100 * np.mean(dice_a), abs=1e-3)
    assert float(rows[1]["dice"]) == pytest.approx(100 * np.mean(dice_b), abs=1e-3)
    assert float(rows[1]["dice_std"]) == pytest.approx(100 * np.std(dice_b, ddof=1), abs=1e-3)
    assert float(rows[2]["iou"]) == 85.9 and float(rows[2]["precision"]) == 94.0 and rows[2]["iou_std"] == ""
    md = open(r["files"]["table_md"]).read()
    assert "| nnU-Net |" in md and "| Med-DisSeg |" in md and "| Med-DisSeg (paper, KvasirSEG) | 85.9 | 91.6" in md
    # paired differences and the Wilcoxon p-value against scipy on the known differences
    with open(r["files"]["differences_csv"], newline="") as f:
        diffs = list(csv.DictReader(f))
    assert [d["case"] for d in diffs] == [f"case_{i:03d}" for i in range(len(K_A))]
    assert {"dice_nnU-Net", "dice_Med-DisSeg", "dice_diff", "iou_diff", "recall_diff",
            "precision_diff"} <= set(diffs[0])
    known = np.array(dice_b) - np.array(dice_a)
    np.testing.assert_allclose([float(d["dice_diff"]) for d in diffs], known, atol=1e-12)
    expected_p = stats.wilcoxon(known).pvalue
    assert r["statistics"]["metrics"]["dice"]["p_value"] == pytest.approx(expected_p, rel=1e-9)
    saved = json.load(open(r["files"]["statistics"]))
    assert saved["metrics"]["dice"]["p_value"] == pytest.approx(expected_p, rel=1e-9)
    assert saved["metrics"]["dice"]["n_better"] == int(np.sum(known > 0))
    assert saved["metrics"]["dice"]["n_tied"] == int(np.sum(known == 0))
    # chart and overlays of the cases that differ most (|dice diff| largest first)
    assert _is_png(r["files"]["chart"])
    order = np.argsort(-np.abs(known), kind="stable")[:3]
    assert [os.path.basename(o) for o in r["files"]["overlays"]] == [f"case_{i:03d}.png" for i in order]
    assert all(_is_png(o) for o in r["files"]["overlays"])
    for n in ("nnU-Net", "Med-DisSeg"):
        assert json.load(open(r["files"][f"summary_{n}"]))["mean"]["dice"] == pytest.approx(
            np.mean(dice_a if n == "nnU-Net" else dice_b))


def test_overlay_titles_say_what_the_number_is(png_folders, tmp_path, monkeypatch):
    ref, a, b, img = png_folders
    titles = []
    monkeypatch.setattr(compare_predictions, "overlay_figure", lambda *args, title, **kwargs: titles.append(title))
    compare_prediction_folders(str(ref), str(a), str(b), str(tmp_path / "out"), image_dir=str(img), num_overlays=2,
                               progress=False)
    known = [dice_after_removing(kb) - dice_after_removing(ka) for ka, kb in zip(K_A, K_B)]
    order = np.argsort(-np.abs(known), kind="stable")[:2]
    assert titles == [f"case_{i:03d}: Dice difference, Med-DisSeg minus nnU-Net: {100 * known[i]:+.1f} points"
                      for i in order]
    assert titles[0] == "case_003: Dice difference, Med-DisSeg minus nnU-Net: +16.6 points"  # 98.99 - 82.35


def test_terminal_text_leaves_out_the_image_links(png_folders, tmp_path):
    ref, a, b, img = png_folders
    r = compare_prediction_folders(str(ref), str(a), str(b), str(tmp_path / "out"), image_dir=str(img),
                                   num_overlays=2, progress=False)
    md = open(r["files"]["table_md"]).read()
    assert "](overlays/case_003.png)" in md  # the report shows its overlays
    text = terminal_text(md)
    assert "![" not in text and "overlays/" not in text and compare_predictions.OVERLAYS_HEADING not in text
    assert text == md.split("\n\n" + compare_predictions.OVERLAYS_HEADING)[0] + "\n"
    assert "| Med-DisSeg |" in text and "Wilcoxon" in text


def test_identical_predictions_and_no_paper_row(png_folders, tmp_path):
    ref, a, _, _ = png_folders
    r = compare_prediction_folders(str(ref), str(a), str(a), str(tmp_path / "o"), names=("A", "B"),
                                   paper_key="Dataset999_Demo", progress=False)
    assert r["paper_key"] is None and [row["name"] for row in r["table"]] == ["A", "B"]
    st = r["statistics"]["metrics"]["dice"]
    assert st["p_value"] == 1.0 and "zero" in st["note"] and st["n_tied"] == len(K_A)
    assert r["files"]["overlays"] == []  # nothing differs
    assert _is_png(r["files"]["chart"])  # no image folder needed


def test_compare_names_must_differ(png_folders, tmp_path):
    ref, a, b, _ = png_folders
    with pytest.raises(ValueError, match="names"):
        compare_prediction_folders(str(ref), str(a), str(b), str(tmp_path / "o"), names=("x", "x"))


def test_compare_missing_case_in_second_folder(png_folders, tmp_path):
    ref, a, b, _ = png_folders
    os.remove(b / "case_003.png")
    with pytest.raises(ValueError, match="case_003.png"):
        compare_prediction_folders(str(ref), str(a), str(b), str(tmp_path / "o"), progress=False)


def test_wilcoxon_p_value_edge_cases():
    assert wilcoxon_p_value([]) == (pytest.approx(np.nan, nan_ok=True), "no cases")
    assert wilcoxon_p_value([0.0, 0.0, 0.0])[0] == 1.0
    d = [0.1, -0.02, 0.3, 0.05, 0.2, 0.0, 0.07]
    assert wilcoxon_p_value(d) == (pytest.approx(stats.wilcoxon(d).pvalue), "")


def test_paper_key_normalisation():
    assert normalise_name("Dataset501_Kvasir-SEG") == "kvasirseg"
    for name, key in [("Dataset501_KvasirSEG", "KvasirSEG"), ("Dataset502_kvasirsessile", "KvasirSessile"),
                      ("GLAS", "GlaS"), ("Dataset504_ISIC-2016", "ISIC2016"), ("isic_2017", "ISIC2017"),
                      ("Dataset506_Synapse", "Synapse")]:
        assert paper_reference(name)[0] == key
    assert paper_reference("Dataset507_CVCClinicDB") is None
    synapse = load_paper_results()["Synapse"]
    assert np.mean(list(synapse["per_label_dice"].values())) == pytest.approx(synapse["metrics"]["dice"], abs=0.05)


BINARY_PAPER_KEYS = ["KvasirSEG", "KvasirSessile", "GlaS", "ISIC2016", "ISIC2017"]


def test_paper_results_name_the_converters_datasets_and_organs():
    """Every paper entry is found from the dataset name a converter writes, and every Synapse organ of
    the paper row is one of the converter's labels (so the reference row is never silently empty)."""
    from nnunetv2_meddisseg.datasets.glas import GLAS_SPEC
    from nnunetv2_meddisseg.datasets.isic import ISIC2016_SPEC, ISIC2017_SPEC
    from nnunetv2_meddisseg.datasets.kvasir import KVASIR_SEG_SPEC, KVASIR_SESSILE_SPEC
    from nnunetv2_meddisseg.datasets.synapse import SYNAPSE_SPEC

    specs = [KVASIR_SEG_SPEC, KVASIR_SESSILE_SPEC, GLAS_SPEC, ISIC2016_SPEC, ISIC2017_SPEC, SYNAPSE_SPEC]
    found = {paper_reference(f"Dataset600_{spec.name}")[0] for spec in specs}
    assert found == set(load_paper_results())
    def words(organ):  # compare matches organs on their sorted words ('kidney_left' = 'left kidney')
        return sorted(re.split(r"[^a-z]+", organ.lower()))

    organs = [words(o) for o in SYNAPSE_SPEC.labels if o != "background"]
    paper_organs = [words(o) for o in load_paper_results()["Synapse"]["per_label_dice"]]
    assert sorted(paper_organs) == sorted(organs) and len(organs) == 8


@pytest.mark.parametrize("key", BINARY_PAPER_KEYS)
def test_paper_results_obey_the_metric_inequalities(key):
    """Per image, IoU <= Dice = 2 IoU / (1 + IoU) and Dice <= (recall + precision) / 2 (harmonic <=
    arithmetic mean); averaged over images, Jensen's inequality (2x / (1 + x) is concave) gives
    mIoU <= mDSC <= 2 mIoU / (1 + mIoU) and mDSC <= (mRec + mPrec) / 2. A mistyped number breaks them."""
    m = load_paper_results()[key]["metrics"]
    iou, dice = m["iou"] / 100, m["dice"] / 100
    assert 0 < iou <= dice <= 2 * iou / (1 + iou) + 5e-4  # the paper rounds to 0.1 %
    if "recall" in m:
        assert dice <= (m["recall"] + m["precision"]) / 200 + 5e-4
        assert all(0 < m[k] <= 100 for k in ("recall", "precision"))


def _write_volume(path, arr):
    sitk.WriteImage(sitk.GetImageFromArray(arr.astype(np.uint8)), str(path))


def test_multiclass_compare_with_synapse_paper_row(tmp_path):
    ref, a, b, img = (tmp_path / n for n in ("labelsTs", "a", "b", "imagesTs"))
    for d in (ref, a, b, img):
        d.mkdir()
    labels = {"background": 0, "aorta": 1, "kidney_left": 2}
    for i in range(3):
        r = np.zeros((4, 12, 12), np.uint8)
        r[1:3, 2:6, 2:6] = 1
        r[1:3, 7:10, 7:10] = 2
        pa = r.copy()
        pa[2, 7:10, 7:10] = 0            # A misses half of the kidney
        pb = r.copy()
        pb[2, 2:6, 2 + i] = 0            # B loses one column of aorta in slice 2
        _write_volume(ref / f"v{i}.nii.gz", r)
        _write_volume(a / f"v{i}.nii.gz", pa)
        _write_volume(b / f"v{i}.nii.gz", pb)
        _write_volume(img / f"v{i}_0000.nii.gz", np.random.default_rng(i).integers(0, 200, r.shape))
    res = compare_prediction_folders(str(ref), str(a), str(b), str(tmp_path / "out"), image_dir=str(img),
                                     paper_key="Synapse", labels=labels, num_overlays=2, progress=False)
    assert res["columns"] == ["dice:aorta", "dice:kidney_left", "dice", "hd95"]
    paper_row = res["table"][-1]
    assert paper_row["values"]["dice:aorta"] == 87.6 and paper_row["values"]["dice:kidney_left"] == 81.6
    assert paper_row["values"]["dice"] == 83.4 and paper_row["values"]["hd95"] is None
    assert res["table"][0]["values"]["dice:aorta"] == pytest.approx(100.0)
    assert res["table"][0]["values"]["dice:kidney_left"] == pytest.approx(100 * 2 * 9 / (18 + 9))
    assert len(res["files"]["overlays"]) == 2 and all(_is_png(o) for o in res["files"]["overlays"])
    assert "HD95" in open(res["files"]["table_md"]).read()


def test_predict_missing_cases_skips_existing(tmp_path):
    images, preds = tmp_path / "imagesTs", tmp_path / "preds"
    images.mkdir()
    preds.mkdir()
    for c in ("x", "y"):
        _write_png(images / f"{c}_0000.png", np.zeros((4, 4, 3)))
        _write_png(preds / f"{c}.png", np.zeros((4, 4)))
    # every case has a prediction: nothing is loaded (the model folder does not even exist)
    assert predict_missing_cases(str(tmp_path / "no_model"), "0", "checkpoint_final.pth", str(images), ".png",
                                 str(preds)) == []
    with pytest.raises(FileNotFoundError, match="imagesTs_missing"):
        predict_missing_cases("m", "0", "c.pth", str(tmp_path / "imagesTs_missing"), ".png", str(preds))


@pytest.fixture
def nnunet_env(tmp_path, monkeypatch, png_folders):
    ref, a, b, img = png_folders
    raw, results = tmp_path / "nnUNet_raw", tmp_path / "nnUNet_results"
    ds = raw / "Dataset987_KvasirSEG"
    ds.mkdir(parents=True)
    os.rename(ref, ds / "labelsTs")
    os.rename(img, ds / "imagesTs")
    (ds / "dataset.json").write_text(json.dumps({"labels": {"background": 0, "polyp": 1}, "file_ending": ".png",
                                                 "channel_names": {"0": "R", "1": "G", "2": "B"},
                                                 "numTraining": 0}))
    results.mkdir()
    monkeypatch.setenv("nnUNet_raw", str(raw))
    monkeypatch.setenv("nnUNet_results", str(results))
    monkeypatch.delenv("nnUNet_preprocessed", raising=False)
    return ds, results, a, b


def test_main_errors_are_one_line(nnunet_env, capsys, monkeypatch):
    ds, results, _, _ = nnunet_env
    assert main(["-d", "988"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nnUNetv2_meddisseg_compare: error: -d 988") and len(err.strip().splitlines()) == 1
    assert main(["-d", "987", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "nnUNetTrainer__nnUNetPlans__2d/fold_0/checkpoint_final.pth" in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.delenv("nnUNet_results")
    assert main(["-d", "987"]) == 2
    assert "nnUNet_results is not set" in capsys.readouterr().err


def test_main_with_existing_predictions(nnunet_env, tmp_path, capsys):
    ds, results, a, b = nnunet_env
    model_a = results / ds.name / "nnUNetTrainer__nnUNetPlans__2d"
    model_b = results / ds.name / "nnUNetTrainerMedDisSeg__nnUNetPlans__2d"  # no nnUNetMedDisSegPlans: fallback
    for m in (model_a, model_b):
        (m / "fold_0").mkdir(parents=True)
        checkpoint = {"network_weights": {}, "trainer_name": m.name.split("__")[0], "init_args": {}}
        torch.save(checkpoint, m / "fold_0" / "checkpoint_final.pth")  # checked, never used here
    out = tmp_path / "cmp"
    (out / "predictions").mkdir(parents=True)
    os.rename(a, out / "predictions" / model_a.name)
    os.rename(b, out / "predictions" / model_b.name)
    assert main(["-d", "987", "-o", str(out), "--device", "cpu", "--num_overlays", "1"]) == 0
    printed = capsys.readouterr().out
    assert "![" not in printed and f"report (tables and overlays): {out / 'comparison.md'}" in printed
    assert "predicted 0 case(s)" in printed and "| Med-DisSeg (paper, KvasirSEG) |" in printed
    assert "| nnU-Net |" in printed and "| Med-DisSeg |" in printed
    assert (out / "comparison.csv").is_file() and (out / "comparison_bar_chart.png").is_file()
    assert len(os.listdir(out / "overlays")) == 1
