"""kvtier.sglang imports without SGLang; the class then refuses with a clear error.

Runs in a subprocess that hides SGLang, so it also runs where SGLang is installed.
"""

import subprocess
import sys

from child import child_env

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
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "refused: kvtier.sglang.KVTierStorage needs SGLang" in proc.stdout
