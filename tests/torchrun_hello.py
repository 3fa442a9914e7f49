"""A torchrun script written with course.world: each rank all-reduces its rank; rank 0 alone prints the sum."""

import torch
import torch.distributed as dist

from course import world

me = world.init_from_env(timeout_s=60)
value = torch.tensor([float(me.rank)], device=me.device)
dist.all_reduce(value)
world.print0(f"world_size={me.world_size} backend={me.backend} sum={value.item():g}")
world.shutdown()
