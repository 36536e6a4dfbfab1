"""Run under torchrun: all-reduce on the "inagg" group until it fails; ``--ddp``: train a DDP model on it;
``--hook``: train a DDP model on gloo with inagg's comm hook.

Each rank prints ``ready R`` after a few good steps, then, when a call fails, one JSON line: its rank,
the error's type and module, its message, the type of the group's ``failure``, and ``time.time()`` when
it reached this script. With ``--die R`` rank R prints ``{"rank": R, "died": time}`` a few steps after
``ready`` and ends its process at once (exit status 0, so that torchrun lets the others run on).
A rank that sees no failure for ``LIMIT`` seconds after ``ready`` prints ``{"rank": R, "type": null}``
and ends: the run ends even when nothing kills the switch.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from inagg.host.torch import allreduce_hook, group_from_process_group
from inagg.host.torch_backend import BACKEND  # importing it registers the backend

LIMIT = 120.0


def say(line: str) -> None:
    """One write of the whole line: the ranks share one output, and a line written in parts can interleave."""
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def main() -> int:
    hook = "--hook" in sys.argv
    dist.init_process_group("gloo" if hook else BACKEND)
    rank = dist.get_rank()
    # Small tensors and a pause between steps: the shared machine's service keeps up without retransmissions.
    ddp = DDP(nn.Linear(16, 16)) if hook or "--ddp" in sys.argv else None
    state = None
    if hook:
        state = group_from_process_group()
        ddp.register_comm_hook(state, allreduce_hook)
    die = int(sys.argv[sys.argv.index("--die") + 1]) if "--die" in sys.argv else None
    step, end = 0, None
    while end is None or time.monotonic() < end:
        if step == 6 and rank == die:
            say(json.dumps({"rank": rank, "died": time.time()}))
            os._exit(0)
        try:
            if ddp is None:
                dist.all_reduce(torch.ones(256))
            else:
                ddp(torch.ones(8, 16)).sum().backward()
        except Exception as e:  # what PyTorch hands the training script
            failure = state.failure if hook else dist.distributed_c10d._get_default_group().failure
            say(json.dumps({"rank": rank, "type": type(e).__name__, "module": type(e).__module__,
                            "message": str(e), "failure": type(failure).__name__, "at": time.time()}))
            return 0
        step += 1
        if step == 3:
            say(f"ready {rank}")
            end = time.monotonic() + LIMIT
        time.sleep(0.05)
    say(json.dumps({"rank": rank, "type": None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
