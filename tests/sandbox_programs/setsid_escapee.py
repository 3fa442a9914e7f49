"""Double-forks a grandchild into its own session (out of the run's process group), which sleeps on; exits 0."""
import os
import sys
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
os.wait()
print("escaped", flush=True)
sys.exit(0)
