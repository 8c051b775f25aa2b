"""Checkpoint manifests: checksums, the manifest file, and verification of what it lists.

Beside the arrays orbax stores, every checkpoint holds ``statevar_checkpoint.json``: each
variable's name, storage key, shape, dtype and sha256, and each data file's path, size and
sha256, sealed by a sha256 of the manifest's own canonical JSON. The manifest is written
last, atomically, after the data is flushed to disk, so a directory whose manifest exists
holds a whole checkpoint. Reading checks the manifest's checksum and structure, then the
data files against their checksums before orbax reads them, then every value read against
its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import uuid
from typing import Any, TypeGuard

import jax
import numpy as np

from .._errors import CheckpointCorruptedError

MANIFEST = "statevar_checkpoint.json"
# The data directory of a CheckpointManager step: orbax's item name.
STEP_ITEM = "state"
_FORMAT = "statevar.checkpoint"
_VERSION = 2
# Version 1 named variables without dict keys and numbered optimizer state; still read.
_READABLE_VERSIONS = (2,)
_DATA_NAME = re.compile(r"^data-[0-9a-f]{32}$")


# --------------------------------------------------------------------------- checksums


def array_sha256(array: Any) -> str:
    """Returns the sha256 of an array's bytes, in C order; reads it to the host.

    Example:
      >>> import hashlib
      >>> import numpy as np
      >>> from statevar._checkpoint.manifest import array_sha256
      >>> array_sha256(np.zeros((2, 2), np.float32)) == hashlib.sha256(bytes(16)).hexdigest()
      True
    """
    if isinstance(array, jax.Array) and not array.is_fully_addressable:
        # Spread over processes (jax.distributed): every process gathers the whole value, in
        # the same order, so that each computes the same checksum.
        from jax.experimental import multihost_utils

        array = multihost_utils.process_allgather(array, tiled=True)
    host = np.ascontiguousarray(np.asarray(array))
    return hashlib.sha256(host.reshape(-1).view(np.uint8).data).hexdigest()


def _file_sha256(path: pathlib.Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def manifest_digest(body: dict[str, Any]) -> str:
    """Returns the sha256 of a manifest without its ``"sha256"`` field, as canonical JSON."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


# --------------------------------------------------------------------------- write


def _fsync(path: pathlib.Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(path: pathlib.Path) -> None:
    """Flushes every file and directory under ``path`` to disk, so that a manifest written
    afterwards never points at data still in the page cache."""
    for root, _, files in os.walk(path):
        for name in files:
            _fsync(pathlib.Path(root, name))
        _fsync(pathlib.Path(root))


def _describe_files(data: pathlib.Path) -> list[dict[str, Any]]:
    """Lists every file orbax wrote under ``data`` with its size and sha256."""
    files = sorted(path for path in data.rglob("*") if path.is_file())
    return [
        dict(path=p.relative_to(data).as_posix(), size=p.stat().st_size, sha256=_file_sha256(p))
        for p in files
    ]


def write_manifest(
    checkpoint: pathlib.Path, data: str | None, entries: list[dict[str, Any]]
) -> None:
    """Flushes the data to disk, then writes the manifest last, atomically: a temporary file,
    flushed, then renamed over the old one.

    Args:
      checkpoint: the checkpoint directory.
      data: the name of the data directory under ``checkpoint``, or None when no array is
        stored (every variable is empty, or there is none).
      entries: one dict per variable: ``name``, ``key`` (orbax's key, None if not stored),
        ``shape``, ``dtype`` and ``sha256``.
    """
    files = []
    if data is not None:
        _fsync_tree(checkpoint / data)
        files = _describe_files(checkpoint / data)
    body = dict(format=_FORMAT, version=_VERSION, data=data, variables=entries, files=files)
    # One variable or file per line, so that the manifest reads well.
    head = json.dumps(dict(format=_FORMAT, version=_VERSION, data=data))[:-1]
    variables, files_text = (
        ",\n".join(f"  {json.dumps(x)}" for x in xs) for xs in (entries, files)
    )
    text = (
        f'{head},\n "variables": [\n{variables}\n ],\n "files": [\n{files_text}\n ],\n'
        f' "sha256": "{manifest_digest(body)}"}}\n'
    )
    temporary = checkpoint / f"{MANIFEST}.tmp-{uuid.uuid4().hex}"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, checkpoint / MANIFEST)
    _fsync(checkpoint)


# --------------------------------------------------------------------------- read and verify


def _all_typed(items: Any, fields: dict[str, Any]) -> TypeGuard[list[dict[str, Any]]]:
    """Whether ``items`` is a list of dicts whose ``fields`` have the given types."""
    return isinstance(items, list) and all(
        isinstance(item, dict) and all(isinstance(item.get(f), t) for f, t in fields.items())
        for item in items
    )


def _manifest_problem(manifest: Any) -> str | None:
    """Returns what is wrong with a parsed manifest, or None."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("sha256"), str):
        return "its manifest is not a statevar manifest"
    body = {key: value for key, value in manifest.items() if key != "sha256"}
    if manifest_digest(body) != manifest["sha256"]:
        return "its manifest does not match its own sha256 checksum"
    if body.get("format") != _FORMAT or body.get("version") not in _READABLE_VERSIONS:
        return (
            f"its manifest has format {body.get('format')!r} version {body.get('version')!r}; "
            f"this statevar reads {_FORMAT!r} version " + " and ".join(map(str, _READABLE_VERSIONS))
        )
    data, entries, files = body.get("data"), body.get("variables"), body.get("files")
    if data is not None and not (data == STEP_ITEM or _DATA_NAME.match(str(data))):
        return f"its manifest names an invalid data directory {data!r}"
    fields = dict(name=str, key=(str, type(None)), shape=list, dtype=str, sha256=str)
    if not _all_typed(entries, fields) or not all(
        isinstance(d, int) and d >= 0 for entry in entries for d in entry["shape"]
    ):
        return "its manifest's variable entries are malformed"
    if not _all_typed(files, dict(path=str, size=int, sha256=str)) or any(
        ".." in file["path"].split("/") or file["path"].startswith("/") for file in files
    ):
        return "its manifest's file entries are malformed"
    names = [entry["name"] for entry in entries]
    keys = [entry["key"] for entry in entries if entry["key"] is not None]
    if len(set(names)) != len(names) or len(set(keys)) != len(keys):
        return "its manifest lists a name or key twice"
    if (keys or files) and data is None:
        return "its manifest lists stored data but no data directory"
    return None


def read_manifest(checkpoint: pathlib.Path, shown: str) -> dict[str, Any]:
    """Reads and checks the manifest of ``checkpoint``, which must exist.

    Args:
      checkpoint: the checkpoint directory.
      shown: the directory as the user gave it, for messages.

    Returns:
      The parsed manifest.

    Raises:
      CheckpointCorruptedError: if the manifest is not valid JSON, does not match its own
        sha256, or is not a well-formed statevar manifest of this version.
    """
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text(encoding="utf-8"))
        problem = _manifest_problem(manifest)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        problem = f"its manifest is not valid JSON ({error})"
    if problem is not None:
        raise CheckpointCorruptedError(f"Checkpoint {shown!r} is corrupted: {problem}")
    return manifest


def verify_data_files(checkpoint: pathlib.Path, manifest: dict[str, Any], shown: str) -> None:
    """Checks every data file the manifest lists against its size and sha256.

    Raises:
      CheckpointCorruptedError: naming every file that is missing or changed.
    """
    data = checkpoint / manifest["data"]
    changed = [
        file["path"]
        for file in manifest["files"]
        if not (data / file["path"]).is_file()
        or (data / file["path"]).stat().st_size != file["size"]
        or _file_sha256(data / file["path"]) != file["sha256"]
    ]
    if changed:
        raise CheckpointCorruptedError(
            f"Checkpoint {shown!r} is corrupted: its data files "
            f"{', '.join(repr(path) for path in changed)} are missing or changed since the "
            "save; no variable was changed"
        )


def verify_values(
    values: dict[str, jax.Array], entries: dict[str, dict[str, Any]], shown: str
) -> None:
    """Checks each value read against its manifest entry's shape, dtype and sha256.

    Args:
      values: the values read, by variable name.
      entries: the manifest entries of those names, by name.
      shown: the checkpoint directory as the user gave it, for messages.

    Raises:
      CheckpointCorruptedError: naming every variable whose value does not match.
    """
    damaged = [
        name
        for name, entry in entries.items()
        if values[name].shape != tuple(entry["shape"])
        or str(values[name].dtype) != entry["dtype"]
        or array_sha256(values[name]) != entry["sha256"]
    ]
    if damaged:
        raise CheckpointCorruptedError(
            f"Checkpoint {shown!r} is corrupted: the stored data of "
            f"{', '.join(repr(name) for name in damaged)} does not match the sha256 checksum "
            "in its manifest; no variable was changed"
        )
