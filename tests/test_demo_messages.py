"""What ``nnUNetv2_meddisseg_demo`` tells before it starts: time and disk of the chosen schedule (the
figures in ``demo.COST``, which docs/testing.md quotes), and a warning where the disk is too small. The whole
demo runs in tests/e2e/test_demo.py."""
import shutil
from pathlib import Path

import pytest

from nnunetv2_meddisseg import demo

ROOT = Path(__file__).resolve().parents[1]


def test_every_schedule_has_its_time_and_disk():
    assert set(demo.COST) == set(demo.SCHEDULES)
    for cost in demo.COST.values():
        assert cost["minutes"] > 0 and cost["disk_gb"] > 0 and cost["machine"]


@pytest.mark.parametrize("schedule", sorted(demo.SCHEDULES))
def test_announcement_states_time_and_disk(schedule, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, 10**12))
    cost = demo.COST[schedule]
    text = demo.announcement(schedule, tmp_path / "not" / "there", kvasir=False)
    assert text == (f"Schedule '{schedule}': about {round(cost['minutes'])} min on {cost['machine']} (less on a GPU) "
                    f"and about {cost['disk_gb']:.1f} GB of disk under {tmp_path / 'not' / 'there'}.")
    assert "Kvasir-SEG's 1,000 images take longer" in demo.announcement(schedule, tmp_path, kvasir=True)


def test_announcement_warns_when_the_free_disk_is_too_small(tmp_path, monkeypatch):
    seen = []

    def disk_usage(path):
        seen.append(Path(path))
        return shutil._ntuple_diskusage(10**12, 10**12 - 3 * 10**8, 3 * 10**8)

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    last = demo.announcement("demo", tmp_path / "new" / "demo", kvasir=False).splitlines()[-1]
    assert last == f"WARNING: only 0.3 GB free at {tmp_path}: the demo may run out of disk."
    assert seen == [tmp_path]  # the nearest folder that exists


def test_the_demo_announces_before_it_starts(tmp_path, monkeypatch, capsys):
    def stop(command, env, log_dir):
        raise demo.UserError(f"stopped before {command[0]}")

    monkeypatch.setattr(demo, "_run", stop)
    assert demo.main(["-o", str(tmp_path / "demo"), "--schedule", "smoke", "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith("Schedule 'smoke': about ")
    assert "stopped before nnUNetv2_plan_and_preprocess" in captured.err


def test_readme_quotes_the_announced_figures():
    readme = (ROOT / "docs" / "testing.md").read_text()  # "Time and disk", moved there from the README
    for schedule, cost in demo.COST.items():
        quote = f"`{schedule}` {cost['minutes']} min and {cost['disk_gb']} GB"
        assert quote in readme, f"docs/testing.md does not say {quote!r} (nnunetv2_meddisseg/demo.py's COST)"
