"""``workflows/bench/release.py``: one command for the benchmarks a release reports (issue 40).

Cheap: its help and its ``--dry-run`` listing, nothing run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASE = ROOT / "workflows" / "bench" / "release.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RELEASE), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_help():
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    assert "--dry-run" in out.stdout and "--only" in out.stdout and "--skip" in out.stdout


def test_the_dry_run_lists_each_benchmark_with_its_current_result_file():
    out = _run("--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    names = [line.split(":")[0] for line in lines]
    assert {"cli_floors", "patches", "engines", "peers", "memory_flat", "billion"} <= set(names)
    for line in lines:
        script = line.split()[1]
        result = line.rsplit("-> ", 1)[1]
        assert (ROOT / script).is_file(), line
        assert (ROOT / result).is_file(), f"{line}: no current result file"


def test_only_and_skip_select_and_unknown_names_are_refused():
    out = _run("--dry-run", "--only", "cli_floors", "patches")
    assert [line.split(":")[0] for line in out.stdout.splitlines()] == ["cli_floors", "patches"]
    out = _run("--dry-run", "--skip", "billion")
    assert "billion" not in [line.split(":")[0] for line in out.stdout.splitlines()]
    out = _run("--dry-run", "--only", "nonesuch")
    assert out.returncode != 0 and "unknown benchmark 'nonesuch'" in out.stderr
