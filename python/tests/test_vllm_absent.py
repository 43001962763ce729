"""kvtier.vllm imports without vLLM; the class then refuses with a clear error.

Runs in a subprocess that hides vLLM, so it also runs where vLLM is installed.
"""

import subprocess
import sys

from child import child_env

CODE = r"""
import sys
sys.modules["vllm"] = None  # `import vllm` now raises ImportError
import kvtier.vllm as kv
assert issubclass(kv.KVTierSecondaryTier, object)
try:
    kv.KVTierSecondaryTier(None, memoryview(bytearray(4096)), "KVTierSecondaryTier")
except ImportError as exc:
    assert "needs vLLM" in str(exc), exc
    print("refused:", exc)
else:
    raise SystemExit("instantiated without vLLM")
"""


def test_imports_without_vllm_and_refuses_clearly():
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "refused: kvtier.vllm.KVTierSecondaryTier needs vLLM" in proc.stdout
