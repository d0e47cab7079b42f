"""The README stays short, and every code block in it runs as written in a fresh directory.

Each fenced block of the README is preceded by a marker comment:

``<!-- doc-test: run -->``
    the block is run: a ``python`` block as a script in the test's process (twice in
    the same session, as a notebook's cell run again), a ``bash`` block with
    ``bash -euo pipefail``, each in a new temporary directory with this tree's package
    on ``PYTHONPATH`` (the console script imports it too);
``<!-- doc-test: skip: REASON -->``
    not run here (it installs, runs for long or needs a service); the reason is shown
    in pytest's summary, and where something else tests the same thing it says what.

The Python blocks of the documentation's Markdown pages (``docs/``) run the same way
unless marked ``skip``, once each: a block whose statements begin another page's block
is run by that one's test. The quickstart workflow the README's main command runs is run
here at a small size, in a copy of ``workflows/``, and must print no warning.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from ooc_spectral.exceptions import DegeneratePartitionWarning, DictionaryWarning, FarRowsWarning

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

MAX_LINES = 150
MAX_LINE_LENGTH = 200

_BLOCK = re.compile(
    r"(?:^<!--\s*doc-test:\s*(?P<marker>[^\n]*?)\s*-->\n)?"  # an optional marker line
    r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```\s*$",
    re.S | re.M)


@dataclass(frozen=True)
class Block:
    source: str        # file, relative to the repository
    line: int          # line of the opening fence
    lang: str
    body: str
    marker: str | None  # "run", "skip: reason", or None

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}:{self.lang or 'text'}"

    @property
    def skip_reason(self) -> str | None:
        if self.marker and self.marker.startswith("skip"):
            return self.marker.partition(":")[2].strip() or "no reason given"
        return None


def code_blocks(path: Path) -> list[Block]:
    text = path.read_text()
    blocks = []
    for m in _BLOCK.finditer(text):
        indent = m["indent"]
        body = re.sub(rf"^{indent}", "", m["body"], flags=re.M)
        line = text.count("\n", 0, m.start("indent")) + 1
        blocks.append(Block(str(path.relative_to(ROOT)), line, m["lang"], body, m["marker"]))
    return blocks


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env["MPLBACKEND"] = "Agg"
    return env


def run_block(block: Block, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run a ``python`` or ``bash`` block in ``cwd``; assert that it succeeded."""
    if block.lang == "python":
        script = cwd / "block.py"
        script.write_text(block.body)
        cmd = [sys.executable, str(script)]
    elif block.lang in ("bash", "sh", "shell"):
        cmd = ["bash", "-euo", "pipefail", "-c", block.body]
    else:
        raise AssertionError(f"{block.id}: no way to run a {block.lang!r} block")
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, (f"{block.id} exited {proc.returncode}\n--- stdout\n"
                                  f"{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def run_python_here(block: Block, cwd: Path, namespace: dict | None = None) -> dict:
    """Run a ``python`` block as a script in this process, in ``cwd`` (the package of
    this tree, matplotlib drawing to files): what a script of it does, without a new
    interpreter importing numpy, scikit-learn, dask and the package once more. With
    ``namespace``, in that one: a notebook's cell run again in the same session."""
    import matplotlib

    assert block.lang == "python", block.id
    matplotlib.use("Agg")
    namespace = {"__name__": "__main__"} if namespace is None else namespace
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        mp.chdir(cwd)
        # an example at its documented settings gets no warning of the package's (a
        # dictionary past the exact problem's size, a degenerate partition, far rows)
        for category in (DictionaryWarning, DegeneratePartitionWarning, FarRowsWarning):
            warnings.simplefilter("error", category)
        exec(compile(block.body, block.id, "exec"), namespace)  # noqa: S102 -- our own docs
    return namespace


def _statements(body: str) -> list[str]:
    """The block's statements, without its comments and layout."""
    return [ast.dump(node) for node in ast.parse(body).body]


# ----------------------------------------------------------------------------- the README
def test_the_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"
    long = [(i + 1, len(line)) for i, line in enumerate(lines) if len(line) > MAX_LINE_LENGTH]
    assert not long, f"lines over {MAX_LINE_LENGTH} characters (line, length): {long}"


def test_the_readme_has_the_two_setup_commands_and_states_the_suite_duration_once():
    text = README.read_text()
    assert 'python -m pip install -e . && ooc-spectral run workflows/quickstart.toml' in text
    assert 'python -m pip install -e ".[test]" && python -m pytest -q' in text
    # .ci/run runs exactly the README's test command
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'python -m pip install -e ".[test]"' in ci and "python -m pytest -q" in ci
    assert len(re.findall(r"\d+ minutes on 2 cores", text)) == 1
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "no dates in the README"
    assert not re.search(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text), \
        "no commit hashes"


def test_every_readme_block_is_run_or_skipped_with_a_reason():
    blocks = code_blocks(README)
    assert blocks, "the README has code blocks"
    for b in blocks:
        assert b.marker is not None, f"{b.id}: no '<!-- doc-test: run -->' or 'skip: reason' marker"
        assert b.marker == "run" or b.skip_reason not in (None, "no reason given"), b.id
    ran = [b for b in blocks if b.marker == "run"]
    assert {b.lang for b in ran} == {"python", "bash"}, "a Python and a shell example are run"


@pytest.mark.parametrize("block", code_blocks(README), ids=lambda b: b.id)
def test_readme_block(block, tmp_path):
    if block.skip_reason:
        pytest.skip(block.skip_reason)
    if block.lang == "python":
        # a notebook user runs the cell again, in the same session and directory: the
        # second run finds the first one's files (the saved model) and must pass too
        session = run_python_here(block, tmp_path)
        run_python_here(block, tmp_path, session)
        return
    proc = run_block(block, tmp_path)
    if block.lang == "bash":
        # the command-line example makes, fits, transforms, plots and verifies
        assert (tmp_path / "fit" / "report.json").exists()
        assert (tmp_path / "unrolled.png").stat().st_size > 10_000
        assert "intact" in proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- the docs' pages
def _doc_python_blocks() -> list[Block]:
    pages = sorted(DOCS.glob("*.md")) + sorted(DOCS.glob("user_guide/*.md"))
    return [b for p in pages for b in code_blocks(p) if b.lang == "python"]


def _run_elsewhere(block: Block) -> Block | None:
    """Another page's block that runs first this block's statements and then more (the
    same example, comments aside, continued there): running it runs this one."""
    mine = _statements(block.body)
    for other in _doc_python_blocks():
        theirs = _statements(other.body)
        if other.id != block.id and not other.skip_reason and len(theirs) > len(mine) \
                and theirs[:len(mine)] == mine:
            return other
    return None


@pytest.fixture(scope="module")
def doc_run(tmp_path_factory):
    """``doc_run(block)``: the namespace the block left, run once for the module in a new
    temporary directory (the pipeline example's test reads what its block's test ran)."""
    ran: dict[str, dict] = {}

    def run(block: Block) -> dict:
        if block.id not in ran:
            ran[block.id] = run_python_here(block, tmp_path_factory.mktemp("block"))
        return ran[block.id]

    return run


@pytest.mark.parametrize("block", _doc_python_blocks(), ids=lambda b: b.id)
def test_docs_python_block(block, doc_run):
    if block.skip_reason:
        pytest.skip(block.skip_reason)
    if _run_elsewhere(block) is None:  # else that block's test runs this one's statements
        doc_run(block)


def test_a_block_run_as_part_of_another_is_that_ones_beginning():
    """docs/representatives.md shows the first statements of docs/clustering.md's example
    (the clustering of the digits, a fit of several seconds): the latter's test runs them."""
    block = next(b for b in code_blocks(DOCS / "representatives.md") if b.lang == "python")
    other = _run_elsewhere(block)
    assert other is not None and other.source == "docs/clustering.md", block.id
    assert _statements(other.body)[:len(_statements(block.body))] == _statements(block.body)


def test_the_pipeline_example_reconstructs_the_rows(doc_run):
    """The user guide's pipeline: pandas output with named columns, and inverse_transform
    gives back the rows to within 5% of the data's RMS radius."""
    pd = pytest.importorskip("pandas")
    block = next(b for b in code_blocks(DOCS / "user_guide" / "estimators.md")
                 if "pipe.inverse_transform(emb)" in b.body)
    ns = doc_run(block)
    X, emb, back = ns["X"], ns["emb"], ns["back"]
    assert isinstance(emb, pd.DataFrame)
    assert list(emb.columns) == [f"greedyspectralembedding{i}" for i in range(10)]
    assert back.shape == X.shape
    radius = np.sqrt(np.mean(np.sum((X - X.mean(0)) ** 2, axis=1)))
    err = np.sqrt(np.mean(np.sum((np.asarray(back) - X) ** 2, axis=1)))
    assert err < 0.05 * radius, err / radius


# ----------------------------------------------------------------------------- the quickstart
def test_the_quickstart_workflow_runs_without_a_warning(tmp_path):
    """The README's main command, at n = 20,000 in a copy of workflows/: exit 0, the picture
    written, and nothing on stderr at WARNING level on a first run."""
    shutil.copytree(ROOT / "workflows", tmp_path / "workflows",
                    ignore=shutil.ignore_patterns("bench", "paper"))
    exe = shutil.which("ooc-spectral") or "ooc-spectral"
    proc = subprocess.run([exe, "run", "workflows/quickstart.toml", "--set", "data.n=20000"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr and "Warning:" not in proc.stderr, proc.stderr[-4000:]
    pictures = list((tmp_path / "results" / "quickstart").rglob("*.png"))
    assert pictures and all(p.stat().st_size > 10_000 for p in pictures), pictures
