"""What keeps a run from touching anything that is not its own (issue 37).

Three rules, each a mechanism rather than a case:

- **An output is created only after it is checked.** :func:`classify_outdir` says what a
  local directory holds (nothing, an ooc-spectral run, what a killed beginning leaves, a
  run whose ``zarr.json`` is garbled, or something foreign) without writing anything; a
  fit or transform calls it before it creates the lock, so a foreign directory is left
  exactly as it was (no ``.lock``, no ``zarr.json``, no ``checkpoint/``); an output that
  is, holds or lies inside the input (:func:`output_outside_input`) or the model a
  transform applies (:func:`output_apart_from_model`) is refused before anything is written.
- **An output is deleted only when it carries this tool's marker for that kind of
  output.** :func:`check_replaceable` is asked before a store is replaced (``make-data
  --overwrite``, ``import --overwrite``, a model saved over another): the group's
  attributes must hold the writer's marker (``ooc_spectral_dataset``,
  ``ooc_spectral_import``, ``ooc_spectral_model``); a user's own zarr group is refused.
- **Files are opened without following symlinks** where a foreign file could be
  planted (:func:`open_nofollow`, :func:`write_file_atomic`): a ``.lock`` or a
  temporary that is a symlink to another file is refused, never written through.

And one rule about damaged files: :func:`read_json_file` turns a garbled JSON file the
run depends on into :class:`~ooc_spectral.exceptions.DamagedFileError` (exit 2) naming
the file and the repair, never a bare ``JSONDecodeError`` (exit 1, "rerun", forever).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from ..exceptions import DamagedFileError, OutputNotWritableError

__all__ = ["classify_outdir", "check_replaceable", "open_nofollow", "write_file_atomic",
           "read_json_file", "bare_group_meta", "unfinished_beginning", "OUTDIR_MEMBERS",
           "output_outside_input", "output_apart_from_model", "remove_members_marker_last"]

#: What an OUTDIR of ooc-spectral may hold (besides zarr's ``*.partial`` temporaries).
OUTDIR_MEMBERS = frozenset({"zarr.json", ".lock", "embedding", "embedding_written",
                            "checkpoint", "model", "report.json", "report.json.partial",
                            "labels", "labels_written", "representatives_model"})


def open_nofollow(path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symlink at ``path`` (exit 2 naming it), never follows it."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputNotWritableError(
                f"{os.fspath(path)!r} is a symbolic link (to {os.readlink(path)!r}); ooc-spectral "
                "never writes through a link where only its own file belongs: remove the link "
                "(it is not this tool's) and run the command again") from None
        raise


def write_file_atomic(path, data: bytes) -> None:
    """Write ``path`` whole or not at all, through a new temporary that is never a link.

    The temporary ``PATH.partial`` is removed first (a link planted there is removed,
    not followed) and created with ``O_EXCL | O_NOFOLLOW``; ``os.replace`` then puts it
    in place of ``path`` (replacing a link at ``path`` rather than writing through it).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_json_file(read, where: str, repair: str):
    """JSON from ``read()`` (bytes or text); a garbled file is :class:`DamagedFileError`
    naming ``where`` and ``repair``. A missing file raises ``FileNotFoundError`` as is."""
    text = read()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise DamagedFileError(
            f"{where} is not valid JSON ({' '.join(str(exc).split())[:120]}); {repair}") from None


def bare_group_meta(read) -> bool:
    """True when the ``zarr.json`` that ``read()`` returns is torn (written partly: a full
    disk), empty, or of a group with no attributes: what a run killed while beginning leaves."""
    try:
        meta = json.loads(read() or "null")
    except (OSError, ValueError):
        return True
    return meta is None or (isinstance(meta, dict) and meta.get("node_type") == "group"
                            and not meta.get("attributes"))


def unfinished_beginning(path: Path, entries) -> bool:
    """True when OUTDIR holds only what a run killed while beginning can leave.

    That is: ``zarr.json`` torn or of a group with no attributes at all, an
    empty ``checkpoint`` group, zarr's ``*.partial`` temporaries. Nothing a
    user made holds data of this shape, so starting over loses nothing.
    """
    for p in entries:
        if p.is_symlink():
            return False
        if p.name.endswith(".partial") and p.is_file():
            continue
        if p.name == "zarr.json" and p.is_file():
            if not bare_group_meta(p.read_text):
                return False
            continue
        if p.name == "checkpoint" and p.is_dir():
            inner = list(p.iterdir())
            if all(q.is_file() and not q.is_symlink()
                   and (q.name == "zarr.json" or q.name.endswith(".partial")) for q in inner):
                continue
        return False
    return True


def classify_outdir(path: Path, run_key: str) -> str:
    """What the local directory ``path`` holds, read without writing anything.

    ``"absent"`` (no such directory, or empty but for a lock), ``"run"`` (``zarr.json``
    holds ``run_key``), ``"unfinished"`` (what a killed beginning leaves: see
    :func:`unfinished_beginning`), ``"damaged"`` (this tool's members with a
    ``zarr.json`` that is not valid JSON) or ``"foreign"``.
    A file (not a directory) at ``path`` is ``"foreign"``.
    """
    if path.is_symlink() and not path.exists():
        return "foreign"
    if not path.exists():
        return "absent"
    if not path.is_dir():
        return "foreign"
    entries = [p for p in path.iterdir() if p.name != ".lock"]
    if not entries:
        return "absent"
    meta_path = path / "zarr.json"
    garbled = False
    if meta_path.is_file() and not meta_path.is_symlink():
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            meta, garbled = None, True
        if isinstance(meta, dict) and run_key in (meta.get("attributes") or {}):
            return "run"
    if unfinished_beginning(path, entries):
        return "unfinished"
    names = {p.name for p in entries}
    ours = names <= OUTDIR_MEMBERS | {n for n in names if n.endswith(".partial")}
    if garbled and ours and names & {"checkpoint", "embedding", "model", "report.json"}:
        return "damaged"
    return "foreign"


def check_replaceable(loc: str, markers, what: str, bare_members=None) -> None:
    """Raise :class:`OutputNotWritableError` unless the store at ``loc`` may be replaced.

    A store may be replaced (deleted, then written again) only when it is absent, an
    empty directory, or a zarr group whose attributes hold one of ``markers`` (this
    tool's marker for that kind of output), or, with ``bare_members``, a group with no
    attributes whose members are among those names (this tool's write killed before its
    marker, which is written last). Anything else, a user's own zarr group included, is
    refused and nothing is deleted.
    """
    from .storage import is_url

    local = not is_url(loc) or loc.startswith("file://")
    if local:
        path = Path(loc.removeprefix("file://"))
        if path.is_symlink():
            raise OutputNotWritableError(
                f"{loc!r} is a symbolic link; --overwrite never deletes through a link: "
                "choose another output path")
        if not path.exists() or (path.is_dir() and not any(path.iterdir())):
            return
        if not path.is_dir():
            raise OutputNotWritableError(
                f"{loc!r} is an existing file, not a directory; choose another output path")
    import zarr

    try:
        group = zarr.open_group(loc, mode="r")
        attrs = dict(group.attrs)
        if not attrs and bare_members is not None and \
                set(group.array_keys()) <= set(bare_members) and not list(group.group_keys()):
            return
    except FileNotFoundError:
        if not local:
            return  # nothing at that URL
        attrs = None
    except Exception:
        attrs = None
    if attrs is not None and any(m in attrs for m in markers):
        return
    raise OutputNotWritableError(
        f"{loc!r} holds data that is not {what} written by ooc-spectral (its attributes carry "
        f"none of {', '.join(sorted(markers))}); --overwrite only replaces {what} this tool "
        "wrote, and nothing was deleted; choose another output path (or delete it yourself)")


def remove_members_marker_last(location, keep=frozenset()) -> None:
    """Delete what the local directory or object-store prefix ``location`` holds (but the
    names in ``keep``), its root ``zarr.json`` (which carries this tool's marker) last;
    nothing there is nothing to do.

    ``--overwrite`` deletes an old output this way so that a kill at any moment leaves the
    marker in place until nothing else is left: the same command, run again, still sees an
    output it may replace and finishes the deletion, instead of refusing a directory with
    no marker as foreign, forever (an outside audit).
    """
    import shutil

    from .storage import filesystem, is_url

    if is_url(location):  # an object store: one prefix per member, deleted in that order
        fs, root = filesystem(location)
        fs.invalidate_cache(root)
        try:
            found = [p for p in fs.ls(root, detail=False)
                     if p.rstrip("/").rsplit("/", 1)[-1] not in keep]
        except FileNotFoundError:
            return
        for p in sorted(found, key=lambda p: p.rstrip("/").endswith("/zarr.json")):
            fs.rm(p, recursive=True)
        fs.invalidate_cache(root)
        return
    path = Path(os.fspath(location).removeprefix("file://"))
    if not path.is_dir():
        return
    members = sorted((p for p in path.iterdir() if p.name not in keep),
                     key=lambda p: p.name == "zarr.json")
    for p in members:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def _resolved(location) -> str:
    """``location`` absolute, a local path with its symbolic links resolved, no final /."""
    from .storage import absolute, is_url

    loc = absolute(location)
    return (loc if is_url(loc) else os.path.realpath(loc)).rstrip("/")


def output_outside_input(out, inp) -> None:
    """Refuse an OUTDIR equal to, inside or holding the input store (exit 2): its own files
    would change the input under the run, and an overwrite could delete the input."""
    o, i = _resolved(out), _resolved(inp)
    if o == i or o.startswith(i + "/") or i.startswith(o + "/"):
        where = ("the input" if o == i else "inside the input" if o.startswith(i + "/") else
                 "a directory that holds the input")
        raise OutputNotWritableError(
            f"the output {out} is {where} {inp}: its files would change the input while the "
            "run reads it (and --overwrite would delete it); nothing was written or deleted; "
            "choose an --out outside the input store")


def output_apart_from_model(out, model) -> None:
    """Refuse a transform's --out equal to, containing or inside the model's directory (a
    fit OUTDIR or a saved model; exit 2): writing --out, and --overwrite deleting what it
    holds, would change or delete the model the command applies (an outside audit)."""
    o, m = _resolved(out), _resolved(model)
    if o == m or o.startswith(m + "/") or m.startswith(o + "/"):
        where = ("the model's directory" if o == m else "inside the model's directory"
                 if o.startswith(m + "/") else "a directory that holds the model")
        raise OutputNotWritableError(
            f"the output {out} is {where} {model}: transform writes --out (and --overwrite "
            "deletes what it holds), which would change or delete the model this command "
            f"applies; nothing was written or deleted; choose an --out outside {model}")
