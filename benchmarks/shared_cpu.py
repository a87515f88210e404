"""Med-DisSeg's training step on a CPU that other processes keep busy, with OpenMP's default wait policy and with
``OMP_WAIT_POLICY=PASSIVE``, side by side in one run.

On the CPU, ``nnUNetv2_train`` runs torch with a thread per core. OpenMP's threads spin for a while when they wait
at the end of a parallel region. When other processes hold the cores, a parallel region then waits for a thread
that is not running. Each measurement is a fresh process (the policy is read when torch loads OpenMP) that times
``--steps`` training steps of MedDisSegNet (cross-entropy, Adam) at ``--size`` while ``--load`` busy-looping
processes run. Prints and writes the median seconds per step of each policy, with and without the load.
"""
import json
import multiprocessing
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional

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


def _busy(stop: "multiprocessing.synchronize.Event") -> None:
    while not stop.is_set():
        sum(range(10_000))


def step_seconds(policy: Optional[str], size: int, batch: int, steps: int, threads: int) -> List[float]:
    """Seconds of each timed training step, in a fresh process with ``OMP_WAIT_POLICY`` = ``policy``."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    proc = subprocess.run([sys.executable, "-c", STEP_TIMER, str(size), str(batch), str(steps), str(threads)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args) -> Dict[str, Dict[str, float]]:
    """Median seconds per step, by load ("as found": no process added; "loaded": ``args.load`` added) and policy."""
    results: Dict[str, Dict[str, float]] = {"as found": {}, "loaded": {}}
    for load in results:
        stop = multiprocessing.Event()
        workers = [multiprocessing.Process(target=_busy, args=(stop,), daemon=True)
                   for _ in range(args.load if load == "loaded" else 0)]
        for w in workers:
            w.start()
        try:
            for policy in POLICIES:
                seconds = sorted(step_seconds(policy, args.size, args.batch, args.steps, args.threads))
                results[load][policy or "default"] = seconds[len(seconds) // 2]
                print(f"{load}, OMP_WAIT_POLICY {policy or 'unset'}: {seconds[len(seconds) // 2]:.2f} s / step",
                      flush=True)
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=10)
    return results


def main(argv: Optional[List[str]] = None) -> int:
    p = argument_parser(__doc__, "shared_cpu")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (nnUNetv2_train: one a core)")
    p.add_argument("--load", type=int, default=os.cpu_count(), help="busy-looping processes added ('loaded')")
    args = p.parse_args(argv)
    began = time.time()
    results = measure(args)
    payload = {"machine": machine_info(), "command": command_line(), "settings": vars(args) | {"out": None},
               "seconds_per_step": results, "wall_s": time.time() - began}
    rows = [[load, *[f"{results[load][k]:.2f}" for k in ("default", "PASSIVE")],
             f"{results[load]['default'] / results[load]['PASSIVE']:.1f}x"] for load in results]
    body = [f"MedDisSegNet, one training step at {args.size}x{args.size}, batch {args.batch}, {args.threads} torch "
            f"threads. 'as found': the machine as it was (its load average above); 'loaded': {args.load} "
            f"busy-looping processes added. Median of {args.steps} steps, seconds.", "",
            markdown_table(["CPU", "OMP_WAIT_POLICY unset", "PASSIVE", "unset / PASSIVE"], rows)]
    return report(args.out, "shared_cpu", payload, "\n".join(body))


if __name__ == "__main__":
    raise SystemExit(main())
