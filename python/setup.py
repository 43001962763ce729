"""Builds the kvtier wheel with libkvtier.so inside the package.

The library is the one CMake links (from libkvtier.a with abi/kvtier.map, so
its exports carry the KVTIER_<abi> symbol versions; cargo's own cdylib has
none). It comes from $KVTIER_LIBRARY if set (scripts/build_wheel.sh sets it);
otherwise CMake builds it from the repository this directory belongs to
(python/..), which needs cmake, cargo and a C compiler. Any failure stops the
build: an older library is never packaged in its place.

The `kvtier` command (cli/) goes in beside it, as kvtier/bin/kvtier, which the
`kvtier` console script (kvtier._cli) runs: $KVTIER_CLI if set (it must
exist), else the one CMake staged beside the library. Everything else is in
pyproject.toml.
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
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel support: build_py and the like still run
        bdist_wheel = None

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIBRARY = "libkvtier.so"
CLI = "kvtier"


def fail(message: str):
    raise SystemExit(f"kvtier: {message}")


def checked(path: Path) -> Path:
    """`path`, if it is a library CMake linked (it names a KVTIER_ version node)."""
    if not path.is_file():
        fail(f"{path} does not exist")
    if b"\0KVTIER_" not in path.read_bytes():
        fail(
            f"{path} has no KVTIER_ symbol versions: it is not the library CMake links "
            "(cargo's target/release/libkvtier.so is not shipped); build it with "
            "`cmake -S . -B build && cmake --build build` and use build/lib/libkvtier.so.1"
        )
    return path


def cmake_built_library(build_dir: Path) -> Path:
    """Configures and builds the library alone (no tests) in `build_dir`."""
    if not (REPO / "CMakeLists.txt").is_file():
        fail(
            f"no kvtier repository at {REPO} to build libkvtier.so from; set "
            "KVTIER_LIBRARY to a library CMake built, or install a wheel "
            "(scripts/build_wheel.sh)"
        )
    cmake = shutil.which("cmake")
    if cmake is None:
        fail(
            "building from source needs cmake (and cargo and a C compiler); install "
            "them, or install a prebuilt wheel (scripts/build_wheel.sh)"
        )
    steps = [
        [cmake, "-S", str(REPO), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
         "-DKVTIER_BUILD_TESTS=OFF"],
        [cmake, "--build", str(build_dir)],
    ]
    for step in steps:
        try:
            subprocess.run(step, check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            fail(f"`{' '.join(step)}` failed ({exc}); nothing was packaged")
    return checked((build_dir / "lib" / f"{LIBRARY}.1").resolve())


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        env = os.environ.get("KVTIER_LIBRARY")
        if env:
            library = checked(Path(env))
        else:
            build_temp = Path(self.get_finalized_command("build").build_temp)
            library = cmake_built_library(build_temp.resolve() / "cmake")
        dest = Path(self.build_lib) / "kvtier" / LIBRARY
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, dest)
        dest.chmod(0o755)
        cli = bundled_cli(library)
        if cli is not None:
            dest = Path(self.build_lib) / "kvtier" / "bin" / CLI
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cli, dest)
            dest.chmod(0o755)


def bundled_cli(library: Path):
    """The kvtier command to package: $KVTIER_CLI, else the one CMake staged
    beside `library` (KVTIER_BUILD_CLI, on by default), else none (the
    console script then says the command was not built into this install)."""
    env = os.environ.get("KVTIER_CLI")
    if env:
        if not Path(env).is_file():
            fail(f"KVTIER_CLI={env} does not exist")
        return Path(env)
    beside = Path(library).resolve().parent / CLI
    if beside.is_file():
        return beside
    print(f"kvtier: no kvtier command beside {library}; the wheel will have none", flush=True)
    return None


class BinaryDistribution(Distribution):
    """The wheel carries a native library, so it is platform-specific."""

    def has_ext_modules(self):
        return True


commands = {"build_py": BuildPyWithLibrary}
if bdist_wheel is not None:

    class PlatformWheel(bdist_wheel):
        """No Python extension inside: any Python 3, one platform (auditwheel
        then gives it its manylinux tag)."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    commands["bdist_wheel"] = PlatformWheel

# setuptools runs this file as __main__; the tests load it to call the functions above.
if __name__ == "__main__":
    setup(distclass=BinaryDistribution, cmdclass=commands)
