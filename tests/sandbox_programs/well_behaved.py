"""Behaves: prints to both streams, writes a small file in its working directory, exits 0."""
import sys
from pathlib import Path

for step in range(3):
    print(f"step {step} loss {1.0 / (step + 1):.3f}")
print("a warning on stderr", file=sys.stderr)
Path("checkpoint.txt").write_text("weights")
print("é ünïcode survives")
