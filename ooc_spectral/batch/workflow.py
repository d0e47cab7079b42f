"""Declarative workflow files: TOML data, never executed.

A workflow is a list of steps, each a command-line subcommand with its
options written as TOML keys::

    [workflow]
    name = "quickstart"
    root = ".."                    # paths below are relative to this (itself
                                   # relative to the file's directory)

    [[step]]
    run = "make-data"              # make-data | fit | transform | plot | evaluate | inspect
    id = "data"                    # optional; --set uses it
    name = "swiss-roll"
    n = 1_000_000
    out = "results/quickstart/data.zarr"

    [[step]]
    run = "fit"
    input = "results/quickstart/data.zarr"
    out = "results/quickstart/fit"
    n_components = 2

Keys are the long options of the subcommand with ``-`` written ``_``
(``n_components`` for ``--n-components``), plus its positional arguments by
name (``input``, ``model``, ``outdir``, ``path``, ``name``). Every key is checked
against the subcommand before any step runs; an unknown key, a bad value or a
missing required key is a :class:`~ooc_spectral.exceptions.WorkflowError`
naming the file, the step and the key. Paths (``input``, ``out``, ``outdir``,
``model``, ``path``, ``performance_report``) resolve relative to the workflow's
root and may not escape it (an absolute path is taken as written). ``ooc-spectral run FILE --set STEP.KEY=VALUE`` overrides a key (VALUE is
read as a TOML value, or else as a string). The fit step stores the resolved
step in its output's attributes.

Object storage: any path may be a URL (``s3://bucket/run``); a top-level
``[storage_options]`` table (and a step's own ``storage_options`` table, and
``run --storage-options``, in increasing precedence) adds file-system options
such as ``endpoint_url`` to the backend's own configuration. A file's tables may
set only the options of :data:`FILE_STORAGE_OPTIONS` (``endpoint_url``,
``client_kwargs.endpoint_url`` and ``client_kwargs.region_name``, ``key``,
``secret``, ``token``, ``anon``); any other (a proxy, ``use_ssl``, ``verify``, a
host or account) is refused, exit 2, and comes from ``run --storage-options``
or the backend's configuration. Keep secrets in
the backend's configuration (``AWS_*`` variables, profiles) rather than in the
file; the values are never written to outputs (the fit step records the
option names only).

Trust model: a workflow file is data that anyone may have written, so by
itself it can only read inputs and create outputs. What could hurt the host
needs the command line's permission (``run --allow WHAT`` or
``$OOC_SPECTRAL_ALLOW``): ``scheduler`` (a dask scheduler is trusted code:
dask's protocol unpickles what it sends, so connecting runs its code here;
refused without it), ``overwrite`` (ignored with a warning without it; even with
it only an ooc-spectral output is ever deleted) and ``outside-cwd`` (a
``root`` above both the current directory and the file's directory; refused
without it), ``outside-root`` (a step writing, with ``out`` or
``performance_report``, anywhere but under the root: an absolute path elsewhere, a
``file://`` URL, an object-store URL; refused without it) and ``endpoint=URL`` (a
``storage_options`` table of the file setting ``endpoint_url`` or
``client_kwargs.endpoint_url`` to that URL: refused for any endpoint not named, since the
requests are signed with the user's credentials and carry the model's rows), and
``read=URL`` (a step reading a URL, ``input``, ``model``, ``outdir`` or ``path`` =
``http://...``, ``s3://...``, ``gs://...``: refused unless it is that URL or lies under it,
since the file would make this command send requests, maybe signed with your
credentials, to a place the command line did not name; local paths are read as
documented above: relative ones inside the root, absolute ones as written).
``resources`` (more workers x threads than the host has cores, or ``chunk_rows``
below :data:`MIN_CHUNK_ROWS`; refused without it). ``--set`` overrides and ``run
--storage-options`` come from the command line and need no permission.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .commands import run_command
from ..exceptions import UsageError, WorkflowError
from ..io.storage import check_local_path

__all__ = ["load_workflow", "run_workflow", "STEP_ACTIONS", "PATH_KEYS"]

log = logging.getLogger("ooc_spectral")

STEP_ACTIONS = ("make-data", "fit", "transform", "plot", "evaluate", "inspect")
#: What a workflow file may do only when the command line allows it (``run --allow``).
PERMISSIONS = ("scheduler", "overwrite", "outside-cwd", "outside-root", "resources",
               "endpoint=URL", "read=URL")
#: Without ``--allow resources``: the smallest chunk of rows a file may ask for (smaller
#: ones make one file per few rows: 40k files for 40k rows at chunk_rows = 1).
MIN_CHUNK_ROWS = 256
PATH_KEYS = {"input", "out", "outdir", "model", "path", "performance_report", "workflow",
             "cache_dir"}
#: The keys that name a place a step writes: only under the root, unless allowed.
WRITE_KEYS = {"out", "performance_report", "cache_dir"}
_CONTROL = {"help", "func", "json", "quiet", "verbose", "command"}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands of :func:`ooc_spectral.batch.cli.build_parser` (its ``commands``)."""
    commands = getattr(parser, "commands", None)
    if not commands:  # pragma: no cover - a parser not made by build_parser
        raise RuntimeError("the parser has no commands; use ooc_spectral.batch.cli.build_parser()")
    return commands


def _parse_value(text: str):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_workflow(path, overrides=(), allow=frozenset()) -> dict:
    """Read and validate the structure of a workflow file (no step runs).

    The file is data from anyone: its ``root`` may not lie above both the
    file's directory and the current directory unless ``allow`` holds
    ``"outside-cwd"``.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise WorkflowError(f"{path}: no such workflow file") from None
    except tomllib.TOMLDecodeError as exc:
        raise WorkflowError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - {"workflow", "step", "storage_options"}
    if unknown:
        raise WorkflowError(f"{path}: unknown top-level key {sorted(unknown)[0]!r}; expected "
                            "[workflow], [storage_options] and [[step]] tables")
    storage_options = data.get("storage_options", {})
    if not isinstance(storage_options, dict):
        raise WorkflowError(f"{path}: storage_options must be a table of file-system options "
                            "([storage_options] endpoint_url = \"...\")")
    check_storage_options(storage_options, allow, f"{path}: [storage_options]")
    meta = data.get("workflow", {})
    if not isinstance(meta, dict):
        raise WorkflowError(f"{path}: workflow = {meta!r} must be a table ([workflow] with "
                            "name, description, root)")
    for key in ("name", "description", "root"):
        if key in meta and not isinstance(meta[key], str):
            raise WorkflowError(f"{path}: [workflow] {key} = {meta[key]!r} must be a string, "
                                f"found {type(meta[key]).__name__}; quote it")
    extra = set(meta) - {"name", "description", "root"}
    if extra:
        raise WorkflowError(f"{path}: [workflow]: unknown key {sorted(extra)[0]!r}; known keys: "
                            "name, description, root")
    steps = data.get("step", [])
    if not isinstance(steps, list) or not steps:
        raise WorkflowError(f"{path}: no [[step]] tables; a workflow needs at least one step")
    ids = []
    from_command_line: set[tuple[int, str]] = set()  # (step, key) given with --set
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise WorkflowError(f"{path}: step {i} is {step!r}, not a table; write each step "
                                "as a [[step]] table with run = \"...\" and its keys")
        action = step.get("run")
        if action not in STEP_ACTIONS:
            raise WorkflowError(f"{path}: step {i}: key 'run' is {action!r}; expected one of "
                                f"{', '.join(STEP_ACTIONS)}")
        ids.append(str(step.get("id", action)))
    for item in overrides:
        target, _, value = item.partition("=")
        step_key, dot, key = target.rpartition(".")
        if not _ or not dot or not key:
            raise WorkflowError(f"{path}: --set {item!r} must look like STEP.KEY=VALUE")
        matches = [i for i, s in enumerate(steps)
                   if step_key in (str(i), str(s.get("id", "")), s.get("run"))]
        if len(matches) != 1:
            raise WorkflowError(f"{path}: --set {item!r}: step {step_key!r} matches "
                                f"{len(matches)} steps; use a step id or index (ids: {', '.join(ids)})")
        steps[matches[0]][key] = _parse_value(value)
        from_command_line.add((matches[0], key))
    root = (path.parent / meta.get("root", ".")).resolve()
    cwd = Path.cwd().resolve()
    if ("outside-cwd" not in allow and not root.is_relative_to(path.parent.resolve())
            and not root.is_relative_to(cwd)):
        raise WorkflowError(
            f"{path}: [workflow] root = {meta.get('root')!r} is {root}, above the directory the "
            f"command runs in ({cwd}) and the file's own directory; a workflow file may not "
            "reach there unless the command line allows it (ooc-spectral run --allow outside-cwd)"
        )
    return {"file": str(path.resolve()), "name": meta.get("name", path.stem), "root": root,
            "storage_options": storage_options,
            "steps": steps, "ids": ids, "from_command_line": from_command_line, "allow": allow}


#: argparse actions whose workflow value must be a TOML boolean.
_BOOLEAN_KINDS = frozenset({"BooleanOptionalAction", "store_true", "store_false"})


def _step_argv(wf: dict, i: int, step: dict, sub: argparse.ArgumentParser) -> tuple[list[str], dict]:
    """Command-line arguments equivalent to one step, with the paths resolved."""
    where = f"{wf['file']}: step {i} ({wf['ids'][i]})"
    positionals = [a for a in sub.arguments if not a.option_strings and a.dest not in _CONTROL]
    options = {}  # every spelling of an option: its dest and each long flag (seed, random_state)
    for a in sub.arguments:
        if a.option_strings and a.dest not in _CONTROL:
            options[a.dest] = a
            for flag in a.option_strings:
                if flag.startswith("--"):
                    options[flag[2:].replace("-", "_")] = a
    known = {a.dest for a in positionals} | set(options)
    resolved = {}
    for key, value in step.items():
        if key in ("run", "id"):
            continue
        if key not in known:
            raise WorkflowError(f"{where}: unknown key {key!r}; known keys: {', '.join(sorted(known))}")
        if (key in options and sub.kinds.get(options[key].dest) in _BOOLEAN_KINDS
                and not isinstance(value, bool)):
            # a quoted "false" is a non-empty string, which Python reads as true
            raise WorkflowError(
                f"{where}: key {key!r} = {value!r} must be true or false (a TOML boolean), "
                f"found {type(value).__name__}; write {key} = "
                f"{str(value).strip().lower() if str(value).strip().lower() in ('true', 'false') else 'true'}"
                " without quotes")
        trusted = (i, key) in wf.get("from_command_line", ())
        if key == "scheduler" and value and not trusted and "scheduler" not in wf.get("allow", ()):
            raise WorkflowError(
                f"{where}: scheduler = {value!r}: a workflow file may connect to a dask scheduler "
                "only when the command line allows it (ooc-spectral run --allow scheduler, or "
                "OOC_SPECTRAL_ALLOW=scheduler): a dask scheduler runs code in this process"
            )
        if not trusted and "resources" not in wf.get("allow", ()):
            _check_resources(where, key, value, step)
        if key == "overwrite" and value and not trusted and "overwrite" not in wf.get("allow", ()):
            log.warning("%s: overwrite = true ignored: the command line did not allow it "
                        "(ooc-spectral run --allow overwrite)", where)
            continue
        if key == "storage_options":
            if not isinstance(value, dict):
                raise WorkflowError(f"{where}: key 'storage_options' must be a table of "
                                    "file-system options")
            if not trusted:
                check_storage_options(value, wf.get("allow", ()), f"{where}: storage_options")
            resolved[key] = value
            continue
        if key in PATH_KEYS:
            if not isinstance(value, str) or not value or "\x00" in value:
                raise WorkflowError(f"{where}: key {key!r} must be a path (a non-empty string)")
            local = value.removeprefix("file://")
            if "://" not in local:
                check_local_path(local, f"{where}: key {key!r} =")  # s3:/x, ~/x: exit 2
                value = _resolve_path(wf, where, key, local,
                                      write=key in WRITE_KEYS and not trusted)
            elif key in WRITE_KEYS and not trusted and "outside-root" not in wf.get("allow", ()):
                raise WorkflowError(
                    f"{where}: key {key!r} = {value!r} writes outside the workflow's root "
                    f"{wf['root']}; a workflow file writes only under its root unless the "
                    "command line allows it (ooc-spectral run --allow outside-root)")
            elif not trusted and dot_segments(value):
                raise WorkflowError(
                    f"{where}: key {key!r} = {value!r} has a '.' or '..' segment: a URL "
                    "in a workflow file is compared with what --allow names as written, and "
                    "the storage client would resolve the segment elsewhere; write the URL "
                    "without it")
            elif key not in WRITE_KEYS and not trusted and not url_allowed(value, wf):
                raise WorkflowError(
                    f"{where}: key {key!r} = {value!r} reads a URL the command line did not "
                    "allow: a workflow file sends requests (to a host, with your credentials) "
                    "only where the command line allows it; if you trust it, run with --allow "
                    f"read={value} (or --allow read=PREFIX for every URL under PREFIX)")
        resolved[key] = value
    argv = [step["run"]]
    for a in positionals:
        if a.dest not in resolved:
            raise WorkflowError(f"{where}: missing required key {a.dest!r}")
        argv.append(str(resolved[a.dest]))
    for key, value in resolved.items():
        if key not in options or key == "storage_options":  # set on the parsed step
            continue
        a = options[key]
        flag = a.option_strings[0] if a.option_strings[0].startswith("--") else max(a.option_strings, key=len)
        kind = sub.kinds.get(a.dest, "store")
        if kind == "BooleanOptionalAction":
            argv.append(flag if value else "--no-" + flag[2:])
        elif kind == "store_true":
            if value:
                argv.append(flag)
        elif kind == "append":
            items = value if isinstance(value, list) else [value]
            if isinstance(value, dict):  # KEY=VALUE options: VALUE as JSON keeps its type
                items = [f"{k}={v if isinstance(v, str) else json.dumps(v)}"
                         for k, v in value.items()]
            for v in items:
                argv += [flag, str(v)]
        else:
            if isinstance(value, (dict, list)):
                raise WorkflowError(f"{where}: key {key!r} must be a single value, not {type(value).__name__}")
            argv += [flag, str(value)]
    return argv, resolved


def _resolve_path(wf: dict, where: str, key: str, value: str, *, write: bool = False) -> str:
    """A step's path: relative ones resolve against the root and must stay inside it; a
    place written (``write``) must lie under the root, links resolved, even when absolute
    (unless the command line allows ``outside-root``)."""
    p = Path(value)
    resolved = (wf["root"] / p).resolve()  # an absolute p stays itself, its links resolved
    if resolved.is_relative_to(wf["root"]):
        return str(resolved)
    if p.is_absolute() and not write:
        return str(p)
    if write and "outside-root" in wf.get("allow", ()):
        return str(p if p.is_absolute() else resolved)
    if write:
        raise WorkflowError(
            f"{where}: key {key!r} = {value!r} is {resolved}, outside the workflow's root "
            f"{wf['root']}; a workflow file writes only under its root unless the command line "
            "allows it (ooc-spectral run --allow outside-root)")
    raise WorkflowError(
        f"{where}: key {key!r} = {value!r} escapes the workflow's root {wf['root']}; "
        "write an absolute path if you mean a place outside it"
    )


def _check_resources(where: str, key: str, value, step: dict) -> None:
    """Refuse a file's request for more workers or threads than this host has cores, or
    for chunks of fewer than :data:`MIN_CHUNK_ROWS` rows (exit 2; ``--allow resources``)."""
    import os

    cores = os.cpu_count() or 1
    why = None
    if key in ("workers", "threads_per_worker") and isinstance(value, int):
        total = int(step.get("workers", 1) or 1) * int(step.get("threads_per_worker", 1) or 1)
        if total > cores:
            why = f"{total} threads on a host of {cores} cores"
    elif key == "chunk_rows" and isinstance(value, int) and value < MIN_CHUNK_ROWS:
        why = (f"chunks of {value} rows (one file per {value} rows; at least "
               f"{MIN_CHUNK_ROWS} without the permission)")
    if why:
        raise WorkflowError(
            f"{where}: key {key!r} = {value!r} asks for {why}; a workflow file may ask for that "
            "only when the command line allows it (ooc-spectral run --allow resources), or set "
            "it with --set")


def dot_segments(url: str) -> bool:
    """Whether the path of ``url`` has a ``.`` or ``..`` segment (percent-encoded or not):
    ``http://host/pub/../x`` is not under ``http://host/pub``."""
    from urllib.parse import unquote

    path = unquote(url.split("://", 1)[-1]).split("?", 1)[0].split("#", 1)[0]
    return any(part in (".", "..") for part in path.replace("\\", "/").split("/"))


def url_allowed(url: str, wf: dict) -> bool:
    """Whether ``run --allow read=PREFIX`` lets the file read ``url``: ``url`` is ``PREFIX``
    or lies under it (at a ``/``), so ``read=s3://bucket`` does not allow ``s3://bucket2``."""
    if dot_segments(url):
        return False
    for a in wf.get("allow", ()):
        if a.startswith("read="):
            prefix = a.split("=", 1)[1].rstrip("/")
            if url.rstrip("/") == prefix or url.startswith(prefix + "/"):
                return True
    return False


def allowed_endpoints(allow) -> set[str]:
    """The endpoints ``--allow endpoint=URL`` named (without a trailing slash)."""
    return {a.split("=", 1)[1].rstrip("/") for a in allow if a.startswith("endpoint=")}


#: The storage options a workflow file may set (its path of keys -> the type of its value):
#: credentials the file brings itself, a region, and an endpoint that ``--allow
#: endpoint=URL`` names. Every other option (a proxy, ``use_ssl``, ``verify``, a host, an
#: account, ``config_kwargs``, ...) is refused: it may send the requests, signed with the
#: user's credentials, elsewhere or in clear; it comes from the command line (``run
#: --storage-options``) or the backend's own configuration.
FILE_STORAGE_OPTIONS = {
    ("endpoint_url",): str,
    ("client_kwargs", "endpoint_url"): str,
    ("client_kwargs", "region_name"): str,
    ("key",): str,
    ("secret",): str,
    ("token",): str,
    ("anon",): bool,
}
_ENDPOINT_OPTIONS = {("endpoint_url",), ("client_kwargs", "endpoint_url")}


def _option_json(path: tuple) -> str:
    """``{"a": {"b": ...}}``: where a refused option goes in ``--storage-options``."""
    text = "..."
    for key in reversed(path):
        text = "{" + json.dumps(key) + ": " + text + "}"
    return text


def check_storage_options(options, allow, where: str) -> None:
    """Refuse (WorkflowError, exit 2) a storage option from a workflow file that is not in
    :data:`FILE_STORAGE_OPTIONS`, or of another type, or an endpoint the command line did
    not allow (``--allow endpoint=URL``). An allow-list, so that no spelling or nesting
    (``config_kwargs = {proxies = {http = ...}}``, ``use_ssl = false``) gets past it."""
    allowed = allowed_endpoints(allow)
    names = ", ".join(".".join(p) for p in FILE_STORAGE_OPTIONS)

    def walk(table: dict, prefix: tuple) -> None:
        for key, value in table.items():
            path = (*prefix, str(key))
            dotted = ".".join(path)
            kind = FILE_STORAGE_OPTIONS.get(path)
            if kind is None and isinstance(value, dict) and any(
                    p[:len(path)] == path for p in FILE_STORAGE_OPTIONS):
                walk(value, path)  # client_kwargs = { region_name = ... }
                continue
            if kind is None:
                raise WorkflowError(
                    f"{where}: {dotted} is not a storage option a workflow file may set; a "
                    f"file may set only {names} (an endpoint only when the command line "
                    "allows it). Any other option (a proxy, use_ssl, verify, a host, an "
                    "account) could send this command's requests, signed with your "
                    "credentials, elsewhere or unencrypted: if you trust this one, give it "
                    f"on the command line, ooc-spectral run FILE --storage-options "
                    f"'{_option_json(path)}', or in the backend's own configuration")
            if not isinstance(value, kind):
                example = '"..."' if kind is str else "true"
                raise WorkflowError(
                    f"{where}: {dotted} must be a {'string' if kind is str else 'boolean'}, "
                    f"found {type(value).__name__}; write {path[-1]} = {example}")
            if path in _ENDPOINT_OPTIONS and value.rstrip("/") not in allowed:
                raise WorkflowError(
                    f"{where}: {dotted} = {value!r} sends this command's requests, signed "
                    "with your credentials and carrying the model's rows, to an endpoint the "
                    f"command line did not allow; if you trust it, run with --allow "
                    f"endpoint={value} (or give it with run --storage-options)")

    walk(options, ())


def run_workflow(path, *, overrides=(), parser: argparse.ArgumentParser,
                 allow=frozenset(), quiet: bool = False, storage_options: dict | None = None) -> dict:
    """Validate every step, then run them in order; returns a summary.

    ``allow`` (a subset of :data:`PERMISSIONS`, from the command line) lets the
    file name a dask scheduler, set ``overwrite = true`` (otherwise ignored
    with a warning) or put its root above the current directory.
    """
    wf = load_workflow(path, overrides, allow=frozenset(allow))
    subs = _subparsers(parser)
    planned = []
    for i, step in enumerate(wf["steps"]):
        argv, resolved = _step_argv(wf, i, step, subs[step["run"]])
        try:
            args = parser.parse_args(argv)
        except UsageError as exc:
            raise WorkflowError(f"{wf['file']}: step {i} ({wf['ids'][i]}): {exc}") from None
        args.quiet, args.verbose = quiet, False  # ``run -q``: every step's cluster is quiet too
        args.json = True  # inspect: no text dump in the middle of a workflow
        options = {**wf["storage_options"], **resolved.get("storage_options", {}),
                   **(storage_options or {})}
        args.storage_options = json.dumps(options) if options else None
        if "storage_options" in resolved:  # the names only: values may be secrets
            from ..io.storage import redact

            resolved = {**resolved, "storage_options": redact(resolved["storage_options"])}
        if step["run"] in ("fit", "transform"):  # named in the run's record: its repair
            args.workflow_attrs = {"workflow": {"file": wf["file"], "name": wf["name"],
                                                "step": wf["ids"][i], "resolved": resolved}}
        planned.append((i, args))
    results = []
    for i, args in planned:
        log.info("workflow %s: step %d (%s)", wf["name"], i, wf["ids"][i])
        try:
            results.append({"step": wf["ids"][i], **(run_command(args) or {})})
        except UsageError as exc:
            raise type(exc)(f"{wf['file']}: step {i} ({wf['ids'][i]}): {exc}") from exc
    return {"status": "complete", "workflow": wf["file"], "steps": results}
