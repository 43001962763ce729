"""Builds the kvtier wheel with libkvtier.so inside the package.

The library comes from $KVTIER_LIBRARY if set; otherwise `cargo build --release`
runs in the repository this directory belongs to (python/..) and its
target/release/libkvtier.so is used. Everything else is in pyproject.toml.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIBRARY = "libkvtier.so"


def library() -> Path:
    env = os.environ.get("KVTIER_LIBRARY")
    if env:
        path = Path(env)
        if not path.is_file():
            raise SystemExit(f"KVTIER_LIBRARY={env} does not exist")
        return path
    if not (REPO / "Cargo.toml").is_file():
        raise SystemExit(
            "kvtier: no repository at {REPO} to build libkvtier.so from; set "
            "KVTIER_LIBRARY to a built library".format(REPO=REPO)
        )
    built = REPO / "target" / "release" / LIBRARY
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    try:
        subprocess.run([cargo, "build", "--release", "--lib"], cwd=REPO, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        if not built.is_file():
            raise SystemExit(f"kvtier: `cargo build --release` failed: {exc}") from exc
        print(f"kvtier: cargo failed ({exc}); packaging the existing {built}")
    return built


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        dest = Path(self.build_lib) / "kvtier" / LIBRARY
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library(), dest)


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it is platform-specific."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """No Python extension inside: any Python 3, one platform."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel},
)
