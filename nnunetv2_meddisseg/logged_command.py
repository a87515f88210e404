"""Running a console command of this Python environment with its output in a log file (the one subprocess runner)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple

from nnunetv2_meddisseg.errors import UserError

__all__ = ["CommandFailed", "CommandStopped", "console_command", "run_logged", "run_logged_status"]


class CommandFailed(UserError):
    """A command exited non-zero (or could not be found); the message names it and its log file."""


class CommandStopped(CommandFailed):
    """A command was still running at its time limit and was stopped (with its child processes)."""


def console_command(name: str) -> str:
    """The executable of a console command: this Python's bin folder first, then ``PATH``; ``python`` is this one."""
    if name == "python":
        return sys.executable
    local = Path(sys.executable).parent / name
    if local.is_file():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise CommandFailed(f"command {name} not found next to {sys.executable} nor on PATH: install nnunetv2 and "
                            f"nnunetv2_meddisseg into this environment")
    return found


def run_logged(command: Sequence[str], env: Mapping[str, str], log_file: Path, echo: bool = True,
               check: bool = True, append: bool = False, timeout_s: Optional[float] = None) -> float:
    """Run ``command`` (``command[0]`` a console command) with its output in ``log_file``; return its wall seconds.

    ``echo`` prints the command and log file before, the time after. ``append`` adds ``$ command`` and the output to
    ``log_file``. With ``check``, a non-zero exit raises ``CommandFailed`` naming the last line of the log. A command
    still running after ``timeout_s`` is stopped with its children, and ``CommandStopped`` raised even unchecked."""
    returncode, seconds = run_logged_status(command, env, log_file, echo=echo, append=append, timeout_s=timeout_s)
    if returncode is None:
        raise CommandStopped(f"'{' '.join(map(str, command))}' was stopped at its time limit of {timeout_s:.0f} s "
                             f"(full log: {log_file})")
    if returncode != 0 and check:
        tail = Path(log_file).read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise CommandFailed(f"'{' '.join(map(str, command))}' failed with exit code {returncode}: {tail[0]} "
                            f"(full log: {log_file})")
    return seconds


def run_logged_status(command: Sequence[str], env: Mapping[str, str], log_file: Path, echo: bool = True,
                      append: bool = False, timeout_s: Optional[float] = None) -> Tuple[Optional[int], float]:
    """``run_logged`` without the check: (exit code, wall seconds); the code is None where ``timeout_s`` stopped
    the command (with its process group)."""
    log_file = Path(log_file)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    executable = console_command(command[0])
    if echo:
        print(f"  $ {' '.join(map(str, command))}   (log: {log_file})", flush=True)
    start = time.perf_counter()
    with open(log_file, "a" if append else "w") as log:
        if append:
            log.write(f"$ {' '.join(map(str, command))}\n")
            log.flush()
        proc = subprocess.Popen([executable, *map(str, command[1:])], env=dict(env), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=timeout_s is not None)
        try:
            returncode: Optional[int] = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = None
    seconds = time.perf_counter() - start
    if echo:
        print(f"    {'stopped after' if returncode is None else 'done in'} {seconds:.1f} s", flush=True)
    return returncode, seconds
