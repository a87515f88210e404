"""The package's one subprocess runner: exit codes, logs, and a time limit that stops the command with its
child processes."""
import os
import time

import pytest

from nnunetv2_meddisseg.logged_command import CommandFailed, CommandStopped, run_logged, run_logged_status


def test_exit_code_and_log(tmp_path):
    code, seconds = run_logged_status(["python", "-c", "print('written'); raise SystemExit(3)"], dict(os.environ),
                                      tmp_path / "a.log", echo=False)
    assert code == 3 and seconds > 0 and (tmp_path / "a.log").read_text().strip() == "written"
    with pytest.raises(CommandFailed, match=r"failed with exit code 3: written \(full log: .*a\.log\)"):
        run_logged(["python", "-c", "print('written'); raise SystemExit(3)"], dict(os.environ), tmp_path / "a.log",
                   echo=False)


def test_a_time_limit_stops_the_command_and_its_children(tmp_path):
    marker = tmp_path / "child_finished"
    child = f"import time, pathlib; time.sleep(3); pathlib.Path({str(marker)!r}).touch()"
    parent = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child!r}]); import time; time.sleep(30)"
    start = time.monotonic()
    code, seconds = run_logged_status(["python", "-c", parent], dict(os.environ), tmp_path / "b.log", echo=False,
                                      timeout_s=1.0)
    assert code is None and seconds < 10 and time.monotonic() - start < 10
    time.sleep(3.5)
    assert not marker.exists()  # the child went with its parent


def test_run_logged_raises_command_stopped_at_its_time_limit(tmp_path):
    with pytest.raises(CommandStopped, match=r"was stopped at its time limit of 1 s \(full log: .*c\.log\)"):
        run_logged(["python", "-c", "import time; time.sleep(30)"], dict(os.environ), tmp_path / "c.log", echo=False,
                   check=False, timeout_s=1.0)
    assert issubclass(CommandStopped, CommandFailed)  # callers that catch failures see a stop as one
