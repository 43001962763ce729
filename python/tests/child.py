"""The environment of a test's child Python process: it imports the kvtier
under test, this source tree's, or with KVTIER_TEST_INSTALLED=1 the installed
package (scripts/test_wheel.sh), as the test process itself does."""

import os
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parent.parent


def child_env(**changes: str) -> dict:
    env = dict(os.environ, **changes)
    if os.environ.get("KVTIER_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = str(PYTHON_DIR)
    return env
