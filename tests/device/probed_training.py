"""Run by ``test_inrank_probes.py`` in a process of its own (the probes install for good): the grader's in-rank
probes (``grader.inrank.probes``) installed as the grader installs them, then two DDP steps of the course's
DigitsCNN on the declared device (``declared_device``). Prints the device errors, where the rank stopped and the
kinds of the records the probes wrote, as JSON.

    python tests/device/probed_training.py RECORDS_FILE
"""

import json
import os
import sys
import tempfile

import torch
from declared_device import device_errors, run_ranks
from torch.nn import functional as F  # noqa: N812
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from course import data, models, world
from grader.inrank import channel, probes


def train(steps: int = 2) -> None:
    me = world.current()
    model = DistributedDataParallel(models.DigitsCNN().to(me.device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_split = data.load("digits").train
    loader = DataLoader(train_split, batch_size=16, sampler=DistributedSampler(train_split))
    for step, (images, labels) in enumerate(loader):
        optimizer.zero_grad()
        F.cross_entropy(model(images.to(me.device)), labels.to(me.device)).backward()
        optimizer.step()
        if step + 1 == steps:
            break


def main(records: str) -> int:
    key = channel.new_key()
    fd = os.open(records, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    writer = channel.Writer(fd, key, callers=(probes.__file__,))
    probes.Probes(writer, 0, seed=0, run_dir=tempfile.mkdtemp()).install()
    outcomes = run_ranks(train, 1)
    os.close(fd)
    with open(records, "rb") as handle:
        kinds = [(channel.unseal(key, line) or {}).get("kind") for line in handle if line.strip()]
    print(json.dumps({"device_errors": device_errors(outcomes), "stopped": [o.stopped for o in outcomes],
                      "kinds": kinds}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
