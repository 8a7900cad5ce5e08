"""Read a text file a user named on the command line: one place, one kind of error.

Every loader of a user-named file (site, simulation parameters and workload, ``--state``,
``--hook``, ``--chain-before/--chain-after``, a script given to ``explain``, ``gres.conf``, a
fake-NVML scenario) reads it through :func:`read_text_file`, so a file that is missing, not a
regular file, too large, not UTF-8 or binary becomes one :class:`~hetslurm.errors.ConfigError`
naming the file, the line and what is wrong (``hetslurm: error: x.toml:3: site file is not
UTF-8 at byte 17 (0xff)``, exit 2) instead of a traceback.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO, Literal

from hetslurm.errors import ConfigError

#: Bound for configuration-sized files (site, parameters, Lua, scripts, gres.conf): the
#: largest shipped site file is a few KiB and Slurm refuses batch scripts over 4 MB
#: (``max_script_size``), so 16 MiB is generous while keeping a mistaken path (a core dump,
#: a disk image) from being read into memory.
MAX_CONFIG_BYTES = 16 << 20
#: Bound for data files (``hetslurm state dump`` output, workload traces): a 100,000-node
#: state is about 30 MB of JSON.
MAX_DATA_BYTES = 1 << 30

Errors = Literal["strict", "surrogateescape"]


def read_text_file(path: str | Path, *, what: str, max_bytes: int = MAX_CONFIG_BYTES,
                   errors: Errors = "strict") -> str:
    """The text of a regular file, checked before it is decoded.

    Args:
        path: The file as the user named it (used as is in messages).
        what: What the file is, for messages ("site file", "--hook file").
        max_bytes: Larger files are refused without being read whole.
        errors: ``"strict"``: the file must be UTF-8 without NUL bytes. ``"surrogateescape"``:
            any bytes are kept (for job scripts, which Slurm passes as bytes); the size and
            regular-file checks still apply.

    Raises:
        ConfigError: The file cannot be opened, is not a regular file (a folder, a FIFO, a
            device), is larger than ``max_bytes``, is not UTF-8 or holds a NUL byte. The
            message names the file, the 1-based line of a bad byte and its offset.
    """
    name = str(path)
    return decode_text(read_file_bytes(name, what=what, max_bytes=max_bytes), what=what,
                       file=name, errors=errors)


def read_file_bytes(path: str | Path, *, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (for parsers that take bytes).

    Raises:
        ConfigError: As :func:`read_text_file`, except for the text checks.
    """
    name = str(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", file=name) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} is not a regular file", file=name)
        if st.st_size > max_bytes:
            raise ConfigError(f"{what} is larger than {max_bytes} bytes ({st.st_size})",
                              file=name)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = _read_bounded(fh, max_bytes, what, name)
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", file=name) from exc
    finally:
        os.close(fd)
    return data


def read_text_stream(stream: BinaryIO, *, what: str, label: str,
                     max_bytes: int = MAX_CONFIG_BYTES, errors: Errors = "strict") -> str:
    """Like :func:`read_text_file` for an open binary stream (stdin); ``label`` names it."""
    return decode_text(_read_bounded(stream, max_bytes, what, label), what=what, file=label,
                       errors=errors)


def decode_text(data: bytes, *, what: str, file: str, errors: Errors = "strict") -> str:
    """``data`` as text, refusing what :func:`read_text_file` refuses (see there)."""
    if errors == "surrogateescape":
        return data.decode("utf-8", "surrogateescape")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{what} is not UTF-8 at byte {exc.start} (0x{data[exc.start]:02x})",
            file=file, line=data.count(b"\n", 0, exc.start) + 1,
        ) from exc
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(f"{what} is binary: NUL byte at byte {nul}", file=file,
                          line=data.count(b"\n", 0, nul) + 1)
    return text


def _read_bounded(fh: BinaryIO, max_bytes: int, what: str, name: str) -> bytes:
    # The size from fstat can be stale (a growing file) or absent (stdin): read one byte
    # past the bound to know whether it was crossed.
    data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ConfigError(f"{what} is larger than {max_bytes} bytes", file=name)
    return data
