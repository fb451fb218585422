"""One training run at a time in an output folder: a lock file that holds the running one's PID and
host for the whole run.

The lock is the file ``.envhub-train.lock`` in the output folder, held with ``flock``: the kernel
lets it go when its process ends, however it ends (a SIGKILL included), so a lock file whose
process is gone is stale, and the next run takes it over (saying whose it was). A second run into
a folder whose lock is held is refused in one line that names the running one. The file is
removed when the run ends.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

from envhub.error import OutputLocked

#: The lock file in an output folder.
LOCK_FILE = ".envhub-train.lock"


def _holder(fd: int) -> dict[str, Any]:
    """What the lock file open at ``fd`` says of its holder (empty when it says nothing readable)."""
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        holder = json.loads(os.read(fd, 4096) or b"{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, Any]) -> str:
    return f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {holder.get('started', '?')}"


class OutputLock:
    """The lock of one output folder, held by this process from :meth:`acquire` to :meth:`release`
    (or the end of a ``with`` block).

    Attributes:
        folder: the output folder.
        taken_over: the holder of the stale lock this one replaced (its process was gone), else None.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self.taken_over: dict[str, Any] | None = None
        self._fd: int | None = None
        self._made_folder = False

    def acquire(self) -> OutputLock:
        """Take the lock (making the folder if need be) and write this process's PID and host in it.

        Raises:
            OutputLocked: when another running process holds it, naming that process.
        """
        self._made_folder = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise OutputLocked(
                    f"{self.folder} is in use by another envhub train run ({_describe(holder)}); wait for it to end, "
                    "or give another --output-dir"
                ) from None
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(fd)  # the holder removed that file as it ended: lock the new one
        previous = _holder(fd)
        self.taken_over = previous or None
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": stamp}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def describe_taken_over(self) -> str | None:
        """One line on the stale lock this one replaced, or None."""
        if self.taken_over is None:
            return None
        return f"{self.path}: the run that held it ({_describe(self.taken_over)}) is gone; this run takes the folder over"

    def release(self) -> None:
        """Remove the lock file and let the lock go; a folder this lock made and nothing else filled
        is removed too (a run that could not start leaves nothing behind)."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        if self._made_folder and not any(self.folder.iterdir()):
            self.folder.rmdir()

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()
