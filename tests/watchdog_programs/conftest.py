collect_ignore_glob = ["test_*.py"]  # run only by tests/test_watchdog.py, in a pytest of its own
