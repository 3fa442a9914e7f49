"""nbval's settings for the notebooks."""

import os

# One torch thread per kernel, as in tests/conftest.py: the test workers already fill the cores.
os.environ["OMP_NUM_THREADS"] = "1"

#: How long nbval waits for each of a cell's output messages once the cell has run. nbval's own 5 s is less
#: than a loaded 2-core machine can take to deliver a message from the kernel, and then a correct cell fails
#: with "Timeout of 5 seconds exceeded waiting for output" (seen on notebook 04's exercise check under load).
OUTPUT_TIMEOUT_S = 60


def pytest_collection_modifyitems(items):
    for item in items:
        if hasattr(item, "output_timeout"):  # an nbval cell
            item.output_timeout = OUTPUT_TIMEOUT_S
