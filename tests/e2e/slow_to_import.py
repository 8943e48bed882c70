"""A model module that takes a while to import, for the signal test of
tests/e2e/test_interrupts_and_faults.py: importing it (while ``tensile run``
checks the config's references, before any run starts) creates the file
named by ``TENSILE_TEST_IMPORT_MARKER`` and then waits, so that the test's
signal arrives while the config is being checked."""
import os
import time
from pathlib import Path

_marker = os.environ.get("TENSILE_TEST_IMPORT_MARKER")
if _marker:
    Path(_marker).touch()
    time.sleep(60)

from tensile_tf.jobs.zoo import mlp  # noqa: E402,F401 - the builder the config names
