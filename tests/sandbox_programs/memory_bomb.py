"""Allocates (and touches) 10 MB after 10 MB forever; argv[1] is a pause between allocations in seconds."""
import sys
import time

pause_s = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
hoard = []
while True:
    hoard.append(b"x" * (10 * 2**20))
    time.sleep(pause_s)
