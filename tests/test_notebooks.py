"""The notebooks are the source: check that they are clean, that the library matches them, and run each one's tests.

Drift checks work on copies in a temporary folder so they never modify the checkout.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MODULE_NBS = sorted(p.name for p in (ROOT / "nbs").glob("[0-9]*.ipynb"))


def _copy_project(tmp_path):
    for name in ("settings.ini", "setup.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "nbs", tmp_path / "nbs")
    shutil.copytree(ROOT / "uaqmem", tmp_path / "uaqmem", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _tool(name, *args, cwd):
    return subprocess.run([str(BIN / name), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _files(folder, pattern):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob(pattern)) if ".ipynb_checkpoints" not in p.parts}


def test_there_are_module_notebooks():
    assert MODULE_NBS, "no module notebooks found in nbs/"


def test_notebooks_are_clean(tmp_path):
    proj = _copy_project(tmp_path)
    before = _files(proj / "nbs", "*.ipynb")
    r = _tool("nbdev_clean", cwd=proj)
    assert r.returncode == 0, r.stderr
    after = _files(proj / "nbs", "*.ipynb")
    dirty = [k for k in before if before[k] != after.get(k)]
    assert not dirty, f"notebooks not clean (run `nbdev_clean`): {dirty}"


def test_library_matches_notebooks(tmp_path):
    proj = _copy_project(tmp_path)
    shutil.rmtree(proj / "uaqmem")
    r = _tool("nbdev_export", cwd=proj)
    assert r.returncode == 0, r.stderr
    exported = _files(proj / "uaqmem", "*.py")
    committed = _files(ROOT / "uaqmem", "*.py")
    missing = sorted(set(exported) - set(committed))
    extra = sorted(set(committed) - set(exported) - {"__init__.py"})
    differ = sorted(k for k in set(exported) & set(committed) if exported[k] != committed[k])
    assert not (missing or extra or differ), (
        f"uaqmem/ differs from nbs/ (run `nbdev_export`): missing={missing} hand-written={extra} differ={differ}")


@pytest.mark.parametrize("notebook", MODULE_NBS)
def test_notebook(notebook):
    "Each notebook's inline tests, through nbdev's own runner (honours `#| eval: false` and flags)."
    r = _tool("nbdev_test", "--path", f"nbs/{notebook}", "--do_print", cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
