"""Forks forever, in every process, ignoring failures: RLIMIT_NPROC and the watchdog must contain it."""
import os
import time

while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.01)
