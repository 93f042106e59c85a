"""Runs import-linter over the contracts in pyproject.toml ([tool.importlinter]), and checks that every
source directory is a regular package (import-linter and setuptools' package discovery skip the rest)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
PACKAGE_ROOT = REPO_ROOT / "src" / "llm_epp"


def _source_dirs() -> list[str]:
    dirs = {
        p.parent.relative_to(PACKAGE_ROOT).as_posix()
        for p in PACKAGE_ROOT.rglob("*.py")
        if "__pycache__" not in p.parts and p.parent != PACKAGE_ROOT
    }
    return sorted(dirs)


@pytest.mark.parametrize("directory", _source_dirs())
def test_every_source_directory_is_a_package(directory: str) -> None:
    assert (PACKAGE_ROOT / directory / "__init__.py").is_file()


def test_import_contracts_are_kept() -> None:
    assert LINT_IMPORTS.is_file(), f"import-linter is not installed next to {sys.executable}"
    proc = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    print(proc.stdout)
    print(proc.stderr, file=sys.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
