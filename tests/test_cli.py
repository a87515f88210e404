"""The commands' error convention (nnunetv2_meddisseg/cli.py): PyTorch's "No CUDA runtime is found" warning, which it
logs where a CUDA toolkit is installed without a usable GPU as soon as a library imports torch.utils.cpp_extension
(NNCF's quantization in the export does), does not come before a command's one-line error."""
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = """
import sys
import torch
from nnunetv2_meddisseg.cli import run_command, _NoCudaHomeWarning
from nnunetv2_meddisseg.errors import UserError


def command(argv):
    import torch.utils.cpp_extension  # logs the warning here where CUDA_HOME is set and no GPU is usable
    raise UserError("bad input")


code = run_command("nnUNetv2_meddisseg_export", command)
print("--- control", file=sys.stderr, flush=True)
logger = torch.utils.cpp_extension.logger
for f in [f for f in logger.filters if isinstance(f, _NoCudaHomeWarning)]:
    logger.removeFilter(f)
torch.utils.cpp_extension._find_cuda_home()  # the same warning, unfiltered
sys.exit(code)
"""


@pytest.mark.skipif(not torch.version.cuda, reason="a CPU-only build of torch never looks for a CUDA toolkit")
def test_the_cuda_home_warning_does_not_precede_the_error_line(tmp_path):
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    command, control = proc.stderr.split("--- control\n")
    assert command == "nnUNetv2_meddisseg_export: error: bad input\n"
    assert "No CUDA runtime is found" in control  # the environment does trigger the warning
