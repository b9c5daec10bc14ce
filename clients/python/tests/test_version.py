"""The package is versioned with the operator."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import egress_proxies

REPO = Path(__file__).resolve().parents[3]
PACKAGE = Path(__file__).resolve().parents[1]


def package_version(toml: Path, section: str) -> str:
    text = toml.read_text()
    body = text.split(f"[{section}]", 1)[1].split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', body, re.MULTILINE)
    assert match, f"no version in [{section}] of {toml}"
    return match.group(1)


def test_the_package_has_the_operators_version() -> None:
    operator = package_version(REPO / "actors" / "Cargo.toml", "package")
    assert package_version(REPO / "Cargo.toml", "package") == operator
    assert package_version(PACKAGE / "pyproject.toml", "project") == operator
    assert egress_proxies.__version__ == operator


def test_the_operator_binary_says_the_same_version() -> None:
    binary = os.environ.get("EPO_OPERATOR_BIN")
    if not binary:
        return
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    assert egress_proxies.__version__ in out.split(), out
