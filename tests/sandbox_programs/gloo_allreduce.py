"""A tiny torchrun job: every rank all_reduces its rank over gloo and checks the sum."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
tensor = torch.tensor([float(rank)])
dist.all_reduce(tensor)
expected = world_size * (world_size - 1) / 2
if tensor.item() != expected:
    raise SystemExit(f"rank {rank}: all_reduce gave {tensor.item()}, expected {expected}")
# One write() per line: the ranks share stdout, and print() may split text and newline into two writes.
os.write(1, f"rank {rank} of {world_size}: sum {tensor.item():g}\n".encode())
dist.destroy_process_group()
