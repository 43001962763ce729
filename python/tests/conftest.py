"""Test setup: import kvtier from this source tree unless told to use the
installed package (KVTIER_TEST_INSTALLED=1, e.g. after `pip install ./python`)."""

import os
import sys
from pathlib import Path

if os.environ.get("KVTIER_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
