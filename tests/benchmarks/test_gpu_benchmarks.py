"""The CPU-checkable parts of the GPU benchmarks: the results they write, the log lines they read from
nnU-Net's training logs (the trainer writes them: the tests build the lines with the trainer's own
format), and the refusal without a GPU."""
import json
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu  # noqa: E402
import gpu_cli  # noqa: E402


def test_gpu_benchmark_refuses_without_cuda_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--out", "unused"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU here" in err[0] and "--device cpu" in err[0]


def test_block_profile_names_every_block_and_item_of_a_module_list():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.blocks = torch.nn.ModuleList([torch.nn.Conv2d(4, 4, 1) for _ in range(2)])

        def forward(self, x):
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return x

    net = Net()
    x = torch.randn(1, 3, 8, 8)
    result = gpu.block_profile(net, lambda: net(x))
    assert set(result["per_block_ms"]) == {"stem", "blocks.0", "blocks.1"}
    assert result["wall_ms"] > 0


def test_markdown_tables_of_both_benchmarks():
    data = {"device": "GPU", "torch": "t", "cuda": "c", "cudnn": 1, "triton": "x", "command": "python gpu.py",
            "infer_batch": 32, "train_images_per_s": {"eager": 39.5}, "infer_images_per_s": {"b32_bf16_channels_last": 294.5},
            "nnunet_infer_images_per_s": {"b4_fp32": 745.4}, "compile_s": {"meddisseg_inference_b32": 97.8},
            "skipped": {"forms/fused": "time budget"}}
    text = gpu.markdown(data)
    assert "| training images/s, eager | 39.5 | - |" in text
    assert "| inference images/s, b32_bf16_channels_last | 294.5 | - |" in text
    assert "| meddisseg_inference_b32 | 97.8 |" in text and "forms/fused (time budget)" in text
    cli = {"device": "GPU", "torch": "t", "command": "c", "completed_through_predict": False,
           "epoch_s": {"meddisseg_bf16_eager": {"meddisseg_stage1": 5.0, "meddisseg_stage2": 7.5}},
           "compile_s": {}, "peak_memory_gib": {"main_training": 1.28},
           "commands": [{"label": "main_train", "rc": "timeout", "seconds": 144.9}]}
    text = gpu_cli.markdown(cli)
    assert "**False**" in text and "| meddisseg_bf16_eager | 5.0 | 7.5 |" in text
    assert "| main_train | timeout | 144.9 |" in text and "| main_training | 1.28 |" in text


def test_the_log_lines_the_cli_benchmark_reads():
    log = "\n".join([
        "2026-11-28 16:29:43.527411: first training step of Stage I: 104.4 s (compilation included) ",
        "2026-11-28 16:29:43.754493: peak GPU memory 1.28 GiB (batch 2) ",
        "2026-11-28 16:29:50.000000: Epoch time: 12.5 s ",
        "2026-11-28 16:30:50.000000: first validation step of Stage II: 30.0 s (compilation included) ",
        "2026-11-28 16:31:50.000000: Epoch time: 3.25 s "])
    assert gpu_cli.epoch_times(log) == [12.5, 3.25]
    assert gpu_cli.first_step_seconds(log) == {"stage1_training_first_step": 104.4,
                                               "stage2_validation_first_step": 30.0}


def test_split_of_the_cli_benchmark_comes_from_the_shipped_split(tmp_path):
    split = gpu_cli.write_split(tmp_path / "split.json", (3, 2, 1))
    shipped = json.loads((BENCHMARKS.parent / "nnunetv2_meddisseg" / "datasets" / "splits" / "kvasir_seg.json").read_text())
    assert split["train"] == shipped["train"][:3] and split["val"] == shipped["val"][:2]
    assert split["test"] == shipped["test"][:1]
    assert json.loads((tmp_path / "split.json").read_text())["test"] == split["test"]
