"""Run under torchrun: all-reduce (``--ddp``: train a DDP model) on the "inagg" group until it fails.

Each rank prints ``ready`` after a few good steps, then, when a call fails, one JSON line: the error's
type and module, its message, the type of the group's ``failure``, and ``time.time()`` when it reached
this script. With ``--die R`` rank R prints ``{"rank": R, "died": time}`` a few steps after ``ready`` and
ends its process at once (exit status 0, so that torchrun lets the others run on).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import inagg.host.torch_backend  # noqa: F401  (registers "inagg")


def main() -> int:
    dist.init_process_group("inagg")
    rank = dist.get_rank()
    # Small tensors and a pause between steps: the shared machine's service keeps up without retransmissions.
    ddp = DDP(nn.Linear(16, 16)) if "--ddp" in sys.argv else None
    die = int(sys.argv[sys.argv.index("--die") + 1]) if "--die" in sys.argv else None
    step = 0
    while True:
        if step == 6 and rank == die:
            print(json.dumps({"rank": rank, "died": time.time()}), flush=True)
            os._exit(0)
        try:
            if ddp is None:
                dist.all_reduce(torch.ones(256))
            else:
                ddp(torch.ones(8, 16)).sum().backward()
        except Exception as e:  # what PyTorch hands the training script
            failure = dist.distributed_c10d._get_default_group().failure
            print(json.dumps({"rank": rank, "type": type(e).__name__, "module": type(e).__module__,
                              "message": str(e), "failure": type(failure).__name__, "at": time.time()}), flush=True)
            return 0
        step += 1
        if step == 3:
            print("ready", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
