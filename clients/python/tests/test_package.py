"""The package as shipped: installable by pip, typed (mypy --strict over
the sources), and written in Python 3.9's grammar."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def test_pip_installs_it_with_its_type_marker(tmp_path: Path) -> None:
    # From a copy: building in place would leave build files in the repository.
    source = tmp_path / "source"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("tests", "__pycache__", "*.egg-info", "build"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-index", "--target", str(tmp_path / "site"), str(source)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    installed = tmp_path / "site" / "egress_proxies"
    assert (installed / "py.typed").exists()
    assert (installed / "scrapy.py").exists()
    assert list((tmp_path / "site").glob("egress_proxies-*.dist-info"))


def test_mypy_strict_finds_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir=/dev/null", "src"],
        capture_output=True, text=True, cwd=PACKAGE,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_sources_parse_as_python_3_9() -> None:
    for source in (PACKAGE / "src").rglob("*.py"):
        ast.parse(source.read_text(), str(source), feature_version=(3, 9))
