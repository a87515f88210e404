"""Med-DisSeg's training step on a CPU shared by two trainings, with OpenMP's default wait policy and with
``OMP_WAIT_POLICY=PASSIVE``, side by side in one run.

On the CPU, ``nnUNetv2_train`` runs torch with a thread per core. OpenMP's threads spin for a while when they wait
at the end of a parallel region. When another training holds the cores, a parallel region then waits for a thread
that is not running. Each measurement starts fresh processes (the policy is read when torch loads OpenMP) that
time ``--steps`` training steps of MedDisSegNet (cross-entropy, Adam) at ``--size``: one process alone, and
``--copies`` processes at the same time, all with the same policy. ``--rounds`` times, the policies alternating.
Prints and writes the seconds per step of each policy, alone and side by side.
"""
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional

import numpy as np
from common import argument_parser, command_line, machine_info, markdown_table, report

STEP_TIMER = """
import json, sys, time
import torch
import torch.nn.functional as F
from nnunetv2_meddisseg.architectures import MedDisSegNet
size, batch, steps, threads = map(int, sys.argv[1:5])
torch.set_num_threads(threads)
torch.manual_seed(0)
net = MedDisSegNet(3, 2)
net.train()
optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
x, y = torch.randn(batch, 3, size, size), torch.randint(0, 2, (batch, size, size))
seconds = []
for _ in range(steps + 1):  # the first step allocates: not counted
    start = time.perf_counter()
    loss = F.cross_entropy(net(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    seconds.append(time.perf_counter() - start)
print(json.dumps(seconds[1:]))
"""

#: OpenMP's wait policies measured: None is the runtime's default (spin, then sleep)
POLICIES = (None, "PASSIVE")


def step_seconds(policy: Optional[str], size: int, batch: int, steps: int, threads: int, copies: int = 1
                 ) -> List[float]:
    """Seconds of each timed training step of ``copies`` fresh processes started together, each with
    ``OMP_WAIT_POLICY`` = ``policy``."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    procs = [subprocess.Popen([sys.executable, "-c", STEP_TIMER, str(size), str(batch), str(steps), str(threads)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(copies)]
    seconds = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"the timing process failed ({proc.returncode}): {err[-2000:]}")
        seconds += json.loads(out.strip().splitlines()[-1])
    return seconds


def measure(args) -> Dict[str, Dict[str, List[float]]]:
    """Median seconds per step of each round, alone and side by side (``args.copies`` processes), by policy."""
    results: Dict[str, Dict[str, List[float]]] = {"alone": {}, "side by side": {}}
    for case, copies in (("alone", 1), ("side by side", args.copies)):
        for _ in range(args.rounds):
            for policy in POLICIES:
                seconds = sorted(step_seconds(policy, args.size, args.batch, args.steps, args.threads, copies))
                median = seconds[len(seconds) // 2]
                results[case].setdefault(policy or "default", []).append(median)
                print(f"{case}, OMP_WAIT_POLICY {policy or 'unset'}: {median:.2f} s / step", flush=True)
    return results


def _cell(values: List[float]) -> str:
    values = sorted(values)
    return f"{values[len(values) // 2]:.2f} ({values[0]:.2f}-{values[-1]:.2f})"


def main(argv: Optional[List[str]] = None) -> int:
    p = argument_parser(__doc__, "shared_cpu")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (nnUNetv2_train: one a core)")
    p.add_argument("--copies", type=int, default=2, help="trainings side by side")
    p.add_argument("--rounds", type=int, default=5, help="measurements of each policy and case, alternating")
    args = p.parse_args(argv)
    began = time.time()
    results = measure(args)
    payload = {"machine": machine_info(), "command": command_line(), "settings": vars(args) | {"out": None},
               "seconds_per_step": results, "wall_s": time.time() - began}
    rows = [[case, *[_cell(results[case][k]) for k in ("default", "PASSIVE")],
             f"{np.median(results[case]['default']) / np.median(results[case]['PASSIVE']):.1f}x"] for case in results]
    body = [f"MedDisSegNet, one training step at {args.size}x{args.size}, batch {args.batch}, {args.threads} torch "
            f"threads a process; 'side by side': {args.copies} such processes at once. Seconds per step: the median "
            f"of {args.rounds} rounds (each the median of the steps timed) and their range.", "",
            markdown_table(["trainings", "OMP_WAIT_POLICY unset", "PASSIVE", "unset / PASSIVE (medians)"], rows)]
    return report(args.out, "shared_cpu", payload, "\n".join(body))


if __name__ == "__main__":
    raise SystemExit(main())
