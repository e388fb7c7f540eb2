"""A source distribution carries what its build needs.

setup.py's build_ext runs kernels/build.py, which reads the CPU, TensorFlow
and FFI sources, the CUDA kernels under kernels/cuda and the vendored XLA FFI
headers under kernels/third_party. An sdist once held only the top of
kernels/ and kernels/ffi, so a wheel built from it would have installed
without any fused kernel. Here `setup.py sdist` runs on a copy of the tree and
the archive must hold every file of kernels/ that git tracks.
"""

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _tracked(prefix: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", prefix], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line]


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(),
                    reason="needs a git checkout to list the tracked kernel sources")
def test_sdist_holds_every_tracked_file_under_kernels(tmp_path):
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "_lib", "*.so", "*.egg-info")
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, tree / name)
    for name in ("keras_ecoc", "ecoc_research", "kernels"):
        shutil.copytree(REPO / name, tree / name, ignore=ignore)
    dist = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)], cwd=tree,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (archive,) = dist.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        held = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = _tracked("kernels")
    assert "kernels/third_party/xla/xla/ffi/api/ffi.h" in wanted  # what build.py includes
    missing = [f for f in wanted if f not in held]
    assert not missing, f"{len(missing)} of {len(wanted)} tracked files missing: {missing[:10]}"
