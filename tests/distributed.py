"""Running a test function in several CPU processes joined by a ``gloo`` process group.

``spawn(worker, world_size, *args)`` starts ``world_size`` processes (``torch.multiprocessing``), each
calling ``worker(rank, world_size, *args)`` inside an initialised process group on a free port of
127.0.0.1 (loopback only); an exception in any of them fails the calling test with its traceback.
Workers must be module-level functions (they are pickled by name).
"""
import os
import socket
import sys
from typing import Callable

import torch
import torch.multiprocessing as mp
from torch import distributed as dist

__all__ = ["spawn"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(rank: int, world_size: int, port: int, worker: Callable, args: tuple) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo")  # loopback only
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        worker(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(worker: Callable, world_size: int, *args) -> None:
    mp.spawn(_run, args=(world_size, _free_port(), worker, args), nprocs=world_size, join=True)
