"""The ``ooc-spectral`` command line.

Subcommands: ``make-data``, ``fit``, ``transform``, ``run``, ``plot``, ``evaluate``,
``inspect``.
Only parsing, signals and reporting live here; each subcommand is a function of
:mod:`ooc_spectral.batch.commands` (``run`` is here: it runs a workflow file,
:mod:`ooc_spectral.batch.workflow`, whose steps are those functions).

Exit codes: 0 success, 1 runtime failure, 2 usage, configuration or input
error. Logs go to stderr; a failure prints one line ``ooc-spectral: error: ...``
on stderr; with ``--json`` a final machine-readable summary line goes to stdout.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import signal
import sys
import threading
from typing import Sequence

from .._version import __version__
from .commands import (LOCATION_ARGS, CommandError, _storage_options, cmd_evaluate, cmd_fit,
                       cmd_import, cmd_inspect, cmd_make_data, cmd_plot, cmd_transform,
                       cmd_verify, run_command)
from ..core.config import parameter_fields
from ..exceptions import (InterruptedRun, UsageError, clear_interrupt, interrupt_signals,
                          note_interrupt, take_interrupt)

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
log = logging.getLogger("ooc_spectral")


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so workflows can report the step.

    It also keeps, in public attributes, what the workflow runner reads to map a
    step's keys to a command's arguments: ``arguments`` (every argument added,
    in order), ``kinds`` (dest -> the ``action=`` it was added with, "store" by
    default) and, on the top-level parser, ``commands`` (name -> subparser).
    """

    def __init__(self, *args, **kwargs):
        self.arguments: list[argparse.Action] = []
        self.kinds: dict[str, str] = {}
        self.commands: dict[str, "_Parser"] = {}
        super().__init__(*args, **kwargs)

    def _record(self, action: argparse.Action, kwargs: dict) -> argparse.Action:
        self.arguments.append(action)
        kind = kwargs.get("action", "store")
        self.kinds[action.dest] = kind if isinstance(kind, str) else kind.__name__
        return action

    def add_argument(self, *args, **kwargs):
        return self._record(super().add_argument(*args, **kwargs), kwargs)

    def add_argument_group(self, *args, **kwargs):
        """A group whose arguments are also listed in :attr:`arguments`."""
        group = super().add_argument_group(*args, **kwargs)
        add = group.add_argument

        def add_argument(*a, **k):
            return self._record(add(*a, **k), k)

        group.add_argument = add_argument
        return group

    def parse_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message):
        """One line, no prefix of its own (``main`` prints ``ooc-spectral: error: ``), with a
        "did you mean" for a misspelt option, subcommand or choice (issue 38)."""
        hint = _did_you_mean(self, message)
        where = "" if " " not in self.prog else f" (`{self.prog} --help` lists them)"
        raise CommandError(message + (f"; did you mean {hint}?" if hint else "")
                           + (where if "unrecognized" in message or "invalid choice" in message
                              else ""))


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings if o.startswith("--")]


def _did_you_mean(parser: "_Parser", message: str) -> str | None:
    """The closest known option, subcommand or choice to what ``message`` refuses
    (``difflib``), as ``--n-components``; None when nothing is close."""
    import difflib
    import re

    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if m:
        close = difflib.get_close_matches(m.group(1), re.findall(r"'([^']*)'", m.group(2)), n=1)
        return f"'{close[0]}'" if close else None
    if "unrecognized arguments:" not in message:
        return None
    argv = getattr(parser, "_argv", [])
    command = next((a for a in argv if a in parser.commands), None)
    known = _option_strings(parser.commands[command] if command else parser)
    hints = []
    for token in message.split("unrecognized arguments:", 1)[1].split():
        if token.startswith("--"):
            close = difflib.get_close_matches(token.split("=", 1)[0], known, n=1, cutoff=0.6)
            if close:
                hints.append(f"{close[0]} (for {token.split('=', 1)[0]})" if hints or
                             sum(t.startswith("--") for t in message.split()) > 1
                             else close[0])
    return ", ".join(hints) or None


# --------------------------------------------------------------------------- #
# options
# --------------------------------------------------------------------------- #
def _add_common(p: argparse.ArgumentParser, func) -> None:
    """The options every command takes (last in its help), and ``func``, which runs it."""
    p.add_argument("--storage-options", metavar="JSON", default=None,
                   help="options of the file system of every URL of the command (s3://, gs://, "
                   "...) as a JSON object, or @FILE.json; they add to the backend's own "
                   "configuration (for S3 the AWS_* variables, AWS_ENDPOINT_URL included, and "
                   "profiles), e.g. '{\"endpoint_url\": \"http://127.0.0.1:9000\"}'; their "
                   "values are never logged nor written to outputs")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors on stderr (for cron)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--json", action="store_true", help="print a one-line JSON summary on stdout at the end")
    p.set_defaults(func=func)


def _add_cluster(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine and cluster (default: threads in this process for inputs "
                             "up to 128 MiB, an embedded LocalCluster for larger ones)")
    g.add_argument("--engine", choices=("auto", "threads", "cluster"), default="auto",
                   help="where the parallel passes run without --scheduler: threads in this "
                   "process (no start-up cost), an embedded LocalCluster of worker processes "
                   "(held to --memory-limit), or auto: threads for inputs of at most 128 MiB "
                   "stored, the cluster for larger ones or when --memory-limit is given "
                   "(default: auto)")
    g.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="address of an existing dask scheduler (default: $DASK_SCHEDULER_ADDRESS)")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes of the embedded cluster (default: number of cores); "
                   "the threads engine runs WORKERS x THREADS-PER-WORKER threads")
    g.add_argument("--threads-per-worker", type=int, default=1, metavar="T")
    g.add_argument("--memory-limit", default="auto", metavar="SIZE",
                   help="per worker of the embedded cluster, e.g. 4GiB (default: auto)")


def _add_estimator_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("estimator (see GreedySpectralEmbedding)")
    for f in parameter_fields():
        meta = f.metadata
        if not meta["cli"]:  # Python objects (a callable kernel's keyword arguments)
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name == "random_state":
            g.add_argument("--seed", "--random-state", dest="random_state", type=int, default=0,
                           metavar="S", help=meta["help"].replace("%", "%%") + " (default: 0)")
            continue
        if meta["type"] is bool:
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                           default=f.default, help=meta["help"].replace("%", "%%"))
            continue
        default = f.default
        if f.name == "output_dtype":  # the command line writes float64 unless asked
            default = "float64"
        kw = dict(dest=f.name, type=meta["type"], default=default,
                  help=f"{meta['help'].replace('%', '%%')} (default: {default})")
        if meta["choices"]:
            kw["choices"] = meta["choices"]
        g.add_argument(flag, **kw)


# --------------------------------------------------------------------------- #
# the command that runs a workflow file
# --------------------------------------------------------------------------- #
def cmd_run(args) -> dict:
    from .workflow import run_workflow

    return run_workflow(args.workflow, overrides=args.set, parser=build_parser(),
                        allow=workflow_permissions(args), quiet=bool(args.quiet),
                        storage_options=_storage_options(args))


def workflow_permissions(args) -> frozenset:
    """What a workflow file may do beyond the defaults: ``--allow`` or ``$OOC_SPECTRAL_ALLOW``."""
    from .workflow import PERMISSIONS

    given = list(args.allow or [])
    given += [v for v in os.environ.get("OOC_SPECTRAL_ALLOW", "").replace(",", " ").split() if v]
    unknown = sorted(v for v in set(given) - set(PERMISSIONS)
                     if not (v.startswith(("endpoint=", "read=")) and "://" in v))
    if unknown:
        raise CommandError(f"--allow {unknown[0]!r} is not one of {', '.join(PERMISSIONS)} "
                           "(also checked in $OOC_SPECTRAL_ALLOW)")
    return frozenset(given)


def _int_or_auto(text: str):
    """``--n-clusters``, ``--n-representatives``: a whole number, or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a whole number nor 'auto'") from None


# --------------------------------------------------------------------------- #
def build_parser() -> argparse.ArgumentParser:
    from ..io.dataset_specs import DATASETS  # the names only: no zarr for --help

    parser = _Parser(prog="ooc-spectral", description=(
        "Greedy spectral embedding (kernel PCA, spectral clustering) of data larger than RAM, "
        "out of core on dask and zarr."),
        epilog="Exit codes: 0 success, 1 runtime failure, 2 usage, configuration or input error.")
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("make-data", help="stream a synthetic data set to zarr",
                       description="Stream a synthetic data set to a zarr group (array 'data' "
                       "plus its generating parameter or label), in flat memory.")
    p.add_argument("name", choices=sorted(DATASETS),
                   help="; ".join(f"{k}: {v.description}" for k, v in sorted(DATASETS.items())))
    p.add_argument("--n", type=int, required=True, help="number of rows")
    p.add_argument("--out", required=True, help="zarr group to create")
    p.add_argument("--dim", type=int, default=None, help="pad with noise dimensions up to D columns")
    p.add_argument("--noise", type=float, default=None, help="std of noise added to every coordinate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per zarr chunk")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="a parameter of the data set (repeatable)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing store (an identical complete one is reused anyway)")
    _add_common(p, cmd_make_data)

    p = sub.add_parser("import", help="stream a Parquet, CSV, .npy or HDF5 table into zarr",
                       description="Stream a table into a zarr group (array 'data', float64 by "
                       "default), batch by batch in flat memory; fit and transform then read it.")
    p.add_argument("input", help="a .parquet, .csv (.tsv, .csv.gz), .npy or .h5/.hdf5 file")
    p.add_argument("--out", required=True, help="zarr group to create")
    p.add_argument("--columns", default=None, metavar="A,B,...",
                   help="columns to keep: names (Parquet, CSV) or indices (.npy, HDF5); "
                   "default: every numeric column")
    p.add_argument("--format", default=None, choices=("parquet", "csv", "npy", "hdf5"),
                   help="default: from the file name")
    p.add_argument("--dataset", default=None, help="HDF5: the 2-D dataset (default: the only one)")
    p.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                   help="CSV: the first line names the columns (--header) or is data "
                   "(--no-header, columns numbered from 0); default: a header unless every "
                   "one of its cells is a number")
    p.add_argument("--chunk-rows", type=int, default=None, help="rows per zarr chunk (65536)")
    p.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    p.add_argument("--overwrite", action="store_true", help="replace an existing store")
    _add_common(p, cmd_import)

    p = sub.add_parser("fit", help="embed a zarr array (the whole pipeline, resumable)",
                       description="Fit the greedy spectral embedding on INPUT and write OUTDIR: "
                       "embedding, model, report.json. Rerunning the same command resumes.")
    p.add_argument("input", help="zarr array, or the group make-data wrote")
    p.add_argument("--out", required=True, metavar="OUTDIR", help="output directory (a zarr group)")
    _add_estimator_options(p)
    g = p.add_argument_group("clustering (see GreedySpectralClustering; its defaults)")
    g.add_argument("--n-clusters", type=_int_or_auto, default=None, metavar="K",
                   help="cluster the rows: K clusters, or 'auto' (K from the eigengap); labels "
                   "are written beside the embedding (n x K unit rows) and report.json holds "
                   "the cluster sizes")
    g.add_argument("--affinity", choices=("representatives", "kernel"), default=None,
                   help="the graph: representatives (the default with --n-clusters): each "
                   "row's nearest representatives, out of core; kernel (the default without "
                   "it): the greedy kernel embedding, no clustering")
    g.add_argument("--n-representatives", type=_int_or_auto, default="auto", metavar="M",
                   help="representatives (default: auto, 100 per cluster up to 1000; at "
                   "most half the rows)")
    g.add_argument("--n-neighbors", type=int, default=5, metavar="NN",
                   help="representatives joined to each row (default: 5)")
    _add_cluster(p)
    g = p.add_argument_group("batch")
    g.add_argument("--checkpoint-every", type=int, default=4, metavar="K",
                   help="save the scan's state every K windows of 65536 rows (default: 4)")
    g.add_argument("--overwrite", action="store_true",
                   help="discard what OUTDIR holds, even a run of another configuration")
    g.add_argument("--performance-report", metavar="FILE.html", default=None,
                   help="write dask's performance report of the run")
    _add_common(p, cmd_fit)

    p = sub.add_parser("transform", help="out-of-sample embedding with a saved model")
    p.add_argument("model", help="a saved model, or a fit OUTDIR")
    p.add_argument("input", help="zarr array of new rows")
    p.add_argument("--out", required=True, help="output group for the embedding")
    p.add_argument("--chunk-rows", type=int, default=None)
    p.add_argument("--overwrite", action="store_true")
    _add_cluster(p)
    _add_common(p, cmd_transform)

    p = sub.add_parser("run", help="run a declarative workflow file (TOML)")
    p.add_argument("workflow", help="a .toml workflow file")
    p.add_argument("--set", action="append", metavar="STEP.KEY=VALUE", default=[],
                   help="override a step's parameter, e.g. --set fit.n_components=3 "
                   "(STEP is the step's id, its action, or its index)")
    p.add_argument("--allow", action="append", metavar="WHAT", default=[],
                   help="let the workflow file connect to the dask scheduler it names (a dask "
                   "scheduler runs code in this process: trust it), delete outputs with "
                   "overwrite = true, set a root above the current directory (outside-cwd), "
                   "write outside its root (outside-root), or send requests to an endpoint "
                   "its storage_options name (endpoint=URL), or read URLs (http://, s3://, "
                   "gs://, ...) that begin with URL (read=URL); one of scheduler, overwrite, "
                   "outside-cwd, outside-root, resources, endpoint=URL, read=URL (repeatable; "
                   "also $OOC_SPECTRAL_ALLOW=scheduler,overwrite)")
    _add_common(p, cmd_run)

    p = sub.add_parser("plot", help="scatter or density plot of an embedding")
    p.add_argument("outdir", help="a fit or transform OUTDIR")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--color-by", choices=("label", "coordinate", "none"), default="label",
                   help="colour by the input's stored label/parameter, or by the next coordinate")
    p.add_argument("--dims", default="0,1", help="the two coordinates to plot (default: 0,1)")
    p.add_argument("--density", choices=("auto", "always", "never"), default="auto",
                   help="density rendering read chunk by chunk (auto: for n >= 10^6)")
    p.add_argument("--title", default=None)
    _add_common(p, cmd_plot)

    p = sub.add_parser("evaluate", help="run an evaluation or a paper reproduction",
                       description="Run an experiment of ooc_spectral.experiments; it writes "
                       "markdown tables and PNG figures under --out.")
    p.add_argument("experiment", nargs="?", help="experiment name (see --list)")
    p.add_argument("--out", default=None, help="directory for the tables and figures")
    p.add_argument("--param", action="append", metavar="KEY=VALUE",
                   help="a parameter of the experiment (repeatable; VALUE read as JSON if it can be)")
    p.add_argument("--cache-dir", default=None,
                   help="where the experiments that cache exact references keep them, so "
                   "that several share them (default: OUT/.reference-cache)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    _add_common(p, cmd_evaluate)

    p = sub.add_parser("verify", help="re-read every chunk of an OUTDIR (or model) and report "
                       "missing or damaged ones (exit 1 when any)")
    p.add_argument("outdir", help="output directory of `fit` (or a saved model)")
    _add_common(p, cmd_verify)

    p = sub.add_parser("inspect", help="readable summary of an OUTDIR, a model or a data set")
    p.add_argument("path")
    _add_common(p, cmd_inspect)
    parser.commands = dict(sub.choices)
    return parser


#: Commands that never start a cluster: their logging set-up does not import dask.
_NO_CLUSTER = frozenset({"make-data", "import", "plot", "verify", "inspect"})


def configure_logging(quiet: bool = False, verbose: bool = False, cluster: bool = True) -> None:
    """Our log lines at info (warning with ``quiet``, debug with ``verbose``) on stderr; the
    cluster machinery's at warning (none with ``quiet``), also once a ``cluster`` command
    imports distributed (:func:`_quiet_libraries`)."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s",
                                           "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger("ooc_spectral")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    # --quiet: our one-line error says what failed; dask's tracebacks and nanny warnings
    # (workers restarted, memory) are noise for cron
    _quiet_libraries(logging.CRITICAL + 1 if quiet else logging.WARNING, override=quiet,
                     before_import=cluster)


#: The loggers of the cluster machinery, with those that distributed sets a level of its
#: own on when it is imported (its ``logging`` configuration's defaults).
_LIBRARY_LOGGERS = ("distributed", "distributed.client", "distributed.gc", "tornado",
                    "tornado.application", "asyncio", "bokeh")


def _quiet_libraries(level: int, override: bool, before_import: bool) -> None:
    """The cluster machinery's loggers at ``level``, now and after ``distributed`` is
    imported: importing it sets the levels of its ``logging`` configuration (``distributed``
    at info, ``distributed.client`` at warning, ...), over any set before. So the same
    levels go into that configuration: over the user's own levels there where
    ``override`` (``-q`` asked for), else under them. A user's ``logging.config``
    dictionary there (``version``) is left as it is: distributed applies it. Not
    ``before_import``: no configuration is touched, nor dask imported for it
    (docs/measurements.md, "Start-up and resident costs")."""
    for name in _LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    if "distributed" in sys.modules or not before_import:
        return  # imported already, it will not set them again; or never imported
    import dask.config

    current = dask.config.get("logging", default=None) or {}
    if isinstance(current, dict) and "version" not in current:
        ours = {n: level for n in _LIBRARY_LOGGERS}
        dask.config.set({"logging": {**current, **ours} if override else {**ours, **current}})


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _runtime_failure(exc: BaseException, args=None) -> str:
    """The one-line message of a runtime failure (exit 1), with the fix where one is known."""
    from ..io.storage import is_unreachable

    text = f"{type(exc).__name__}: {_one_line(exc)}"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        text += ("; the disk is full: free space (or point --out at a larger disk) and rerun "
                 "the same command, it resumes")
    elif is_unreachable(exc, store_only=True):  # not a scheduler's ConnectionError
        text += ("; the object store could not be reached: check the endpoint (--storage-options "
                 "endpoint_url, AWS_ENDPOINT_URL) and the network, then run the same command "
                 "again")
    elif isinstance(exc, PermissionError):
        # an object store's 403 arrives as a bare "Forbidden": say where, and what to check
        places = [str(v) for k in ("model", "input", "path", "out")
                  if (v := getattr(args, k, None)) and "://" in str(v)]
        if places:
            text += (f"; the object store refused access to {' or '.join(places)}: check the "
                     "credentials (--storage-options '{\"key\": ..., \"secret\": ...}' or "
                     "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) and that they may read the "
                     "input and write --out")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code.

    Signals: SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2 raise :class:`InterruptedRun` while
    the command runs (it marks its OUTDIR ``interrupted``: exit 1, resumable). As the
    console script (``argv`` None), once the outcome is known a signal ends the process at
    once *with that outcome's code* (never by the signal's default action, exit 143): while
    the message is printed, and while the interpreter shuts down, to the end.
    A signal that came while the command started (noted by ``ooc_spectral.cli``) is exit 1,
    nothing done.
    """
    console = argv is None
    want_json = "--json" in (argv if argv is not None else sys.argv[1:])
    early = take_interrupt() if console else None  # noted while the modules were imported
    if console:  # registered first, so run last: after the libraries' own exit functions
        import atexit

        atexit.register(_ignore_signals_at_the_end)
    clear_interrupt()
    previous = _interrupt_on_signals()
    code = [EXIT_FAILURE]  # what a signal from the end on exits with
    try:
        try:
            outcome = _outcome(argv, want_json, early)
        except KeyboardInterrupt as exc:  # between two of _outcome's steps
            outcome = _interrupted(exc, want_json, "; run the same command again (it resumes "
                                   "what was begun)")
        code[0] = outcome[0]
    finally:
        if console:
            _exit_on_signals(code)
        else:
            _restore_signals(previous)
        clear_interrupt()  # nothing noted here reaches a later run of this process
    exit_code, message, status, summary, as_json = outcome
    if message is not None:
        return _fail(exit_code, message, as_json, status=status)
    if as_json:
        from ..io import strict_json

        print(strict_json.dumps({"exit_code": EXIT_OK, **(summary or {})}), flush=True)
    return exit_code


def _interrupted(exc: BaseException, want_json: bool, how: str = "") -> tuple:
    name = signal.Signals(getattr(exc, "signum", signal.SIGINT)).name
    clear_interrupt()
    return (EXIT_FAILURE, f"interrupted by {name}" + (how or "; the run is marked interrupted "
            "(unless it had just completed) and the same command resumes it"), "interrupted",
            None, want_json)


def _outcome(argv, want_json: bool, early: int | None) -> tuple:
    """Run the command: ``(exit code, error message or None, status, summary, --json)``."""
    if early is not None:
        return (EXIT_FAILURE, f"interrupted by {signal.Signals(early).name} while starting; "
                "nothing was done: run the same command again", "interrupted", None, want_json)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version
        return int(exc.code or 0), None, None, None, False
    except UsageError as exc:
        return EXIT_USAGE, _one_line(exc), "error", None, want_json
    except KeyboardInterrupt as exc:
        return _interrupted(exc, want_json, " while starting; nothing was done: run the same "
                            "command again")
    try:
        configure_logging(args.quiet, args.verbose, cluster=args.command not in _NO_CLUSTER)
        summary = run_command(args)
        _note_a_late_signal()
    except UsageError as exc:
        return EXIT_USAGE, _one_line(exc), "error", None, args.json
    except KeyboardInterrupt as exc:
        return _interrupted(exc, args.json)
    except Exception as exc:
        from ..io.storage import missing_credentials

        log.debug("traceback", exc_info=True)
        fix = missing_credentials(exc, [getattr(args, k, None) for k in LOCATION_ARGS])
        if fix is not None:  # configuration, not a transient failure: a rerun fails the same way
            return EXIT_USAGE, f"{type(exc).__name__}: {_one_line(exc)}; {fix}", "error", None, \
                args.json
        return EXIT_FAILURE, _runtime_failure(exc, args), "error", None, args.json
    return EXIT_OK, None, None, summary, args.json


def _fail(code: int, message: str, want_json: bool, status: str = "error") -> int:
    from ..io.storage import cancel_pending_requests

    cancel_pending_requests()  # no "Exception ignored in: <coroutine ...>" after the message
    print(f"ooc-spectral: error: {message}", file=sys.stderr, flush=True)
    if want_json:
        print(json.dumps({"status": status, "exit_code": code, "error": message}), flush=True)
    return code


def _note_a_late_signal() -> None:
    """A signal whose exception Python dropped after the run's last step: the run is
    complete (every stage finished and OUTDIR says so); say so rather than hide it."""
    signum = take_interrupt()
    if signum is not None:
        log.warning("%s arrived as the run ended, after its last step; the run is complete",
                    signal.Signals(signum).name)


def _interrupt_on_signals() -> dict:
    """The interrupt signals (:func:`~ooc_spectral.exceptions.interrupt_signals`) raise
    :class:`InterruptedRun` in the main thread (once).

    The job then marks its OUTDIR ``interrupted``, releases the lock and the
    command exits 1 ("rerun"). A second signal during that cleanup ends the
    process at once, as the signal's default action would.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}
    fired = []

    def handler(signum, frame):
        if fired:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        fired.append(signum)
        note_interrupt(signum)  # raised again where the run moves on, if this one is dropped
        raise InterruptedRun(signum)

    return {sig: signal.signal(sig, handler) for sig in interrupt_signals()}


def _exit_on_signals(code: list) -> None:
    """From now on (the console script's outcome is known) the interrupt signals end the
    process at once with ``code[0]``: the run already marked its OUTDIR (complete,
    interrupted or failed), so nothing is left to do but to say so by the exit code."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed pipe: the code still tells
                pass
        os._exit(code[0])

    for sig in interrupt_signals():
        signal.signal(sig, handler)


def _ignore_signals_at_the_end() -> None:
    """The console script's last exit function: the interpreter's own teardown follows,
    which puts back the default action of every signal that has a Python handler (a
    SIGTERM then would end the process as exit 143, its outcome lost); an ignored signal
    is left ignored, and the process ends with its code a moment later."""
    if threading.current_thread() is threading.main_thread():
        for sig in interrupt_signals():
            signal.signal(sig, signal.SIG_IGN)


def _restore_signals(previous: dict) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
