"""kvtier.sglang imports without SGLang; the class then refuses with a clear error.

Runs in a subprocess that hides SGLang, so it also runs where SGLang is installed.
"""

import os
import subprocess
import sys
from pathlib import Path

PYTHON_DIR = Path(__file__).resolve().parent.parent

CODE = r"""
import sys
sys.modules["sglang"] = None  # `import sglang...` now raises ImportError
import kvtier.sglang as kv
try:
    kv.KVTierStorage(None, {})
except ImportError as exc:
    assert "needs SGLang" in str(exc), exc
    print("refused:", exc)
else:
    raise SystemExit("instantiated without SGLang")
"""


def test_imports_without_sglang_and_refuses_clearly():
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    proc = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "refused: kvtier.sglang.KVTierStorage needs SGLang" in proc.stdout
