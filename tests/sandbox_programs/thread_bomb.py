"""Starts sleeping threads without end: RLIMIT_NPROC counts threads too and must stop it."""
import threading
import time

while True:
    threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
