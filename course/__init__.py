"""multigpu-course: teaching primitives for training one network on several GPUs (real or emulated)."""

__version__ = "0.1.0"
