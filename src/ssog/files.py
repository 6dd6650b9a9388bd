"""Writing files without losing any: atomic replacement, refusing to replace results, run-folder locks.

Every file ``ssog`` writes goes through :func:`write_atomic` or :func:`replacing`: the data is
written to a uniquely named temporary in the same folder (its name starts with ``.`` and
contains :data:`TEMP_MARK`), flushed to disk, given the permissions of an ordinary new file
(``0o666 & ~umask``) and renamed over the target with ``os.replace``. A process killed at any
moment leaves either the old file or the new one, never a part of one; a full disk leaves the
old file and a one-line :class:`WriteError` (``disk full (ENOSPC) writing RUN/last.safetensors;
the previous file is kept``).

What a path points to is never replaced: a symbolic link is written through (its target
replaced, the link kept), and a character device or a pipe (``/dev/null``, ``/dev/stdout``, a
FIFO) is written into, not replaced by a regular file.

Results are never replaced unless asked (:func:`refuse_existing`, ``--overwrite``), and a
training run claims its folder with :class:`FolderLock` so that two runs never share one.
"""
from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import socket
import stat
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Iterable, Iterator, TypeGuard

__all__ = [
    "LOCK_HEARTBEAT_S", "LOCK_STALE_AFTER_S", "TEMP_MARK", "FolderLock", "WriteError", "check_output_file",
    "clear_results", "holds_lock", "is_temporary", "new_file_mode", "refuse_existing", "replacing", "save_figure",
    "temporary_path", "write_atomic",
]

#: Part of the name of every temporary file ``ssog`` writes (``.NAME.<pid>-<hex>.ssog-tmp<suffix>``);
#: files without it are never removed.
TEMP_MARK = ".ssog-tmp"

_CAUSES = {
    errno.ENOSPC: "disk full (ENOSPC)",
    errno.EDQUOT: "disk quota exceeded (EDQUOT)",
    errno.EROFS: "read-only file system (EROFS)",
    errno.EACCES: "permission denied (EACCES)",
}


class WriteError(OSError):
    """A file could not be written; its message is one line naming the file and the cause.

    ``errno`` is the cause's (``errno.ENOSPC`` for a full disk); the previous file, if any, is kept.
    """

    def __str__(self) -> str:
        return self.strerror or ""


def _write_error(path: Path, error: OSError, existed: bool) -> WriteError:
    cause = (_CAUSES.get(error.errno) if error.errno is not None else None) or (error.strerror or str(error))
    kept = "the previous file is kept" if existed else "nothing was written"
    return WriteError(error.errno, f"{cause} writing {path}; {kept}")


def is_temporary(path: str | Path) -> bool:
    """Whether ``path`` names a temporary file of :func:`replacing`."""
    return TEMP_MARK in Path(path).name


def temporary_path(path: str | Path) -> Path:
    """A new, unique temporary name for ``path`` in its folder (``.NAME.<pid>-<hex>.ssog-tmp<suffix>``),
    for a file (or folder) that is written whole and then renamed to ``path``."""
    path = Path(path)
    # The suffix is kept so that writers that pick a format by extension (matplotlib) still can.
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{TEMP_MARK}{path.suffix}")


def new_file_mode() -> int:
    """The permissions the umask gives a new file (``0o666 & ~umask``): what files written
    through a temporary get, rather than the temporary's own (``mkstemp`` and safetensors make 0600)."""
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore it (not thread-safe, but brief)
    os.umask(mask)
    return mask


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _publish(tmp: Path, path: Path, overwrite: bool) -> None:
    """Move the finished temporary ``tmp`` to ``path`` (refusing an existing ``path`` unless ``overwrite``)."""
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails if path exists: no window in which another writer's file is replaced
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, f"{path} already exists; pass --overwrite to replace it") from None
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
            raise
        if path.exists():  # a file system without hard links
            raise FileExistsError(errno.EEXIST, f"{path} already exists; pass --overwrite to replace it") from None
        os.replace(tmp, path)
    tmp.unlink(missing_ok=True)


def _is_stream(path: Path) -> bool:
    """Whether ``path`` (links followed) is a character device or a pipe: what is written there
    is passed on, not stored (``/dev/null``, ``/dev/stdout``, a FIFO)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _not_a_file(path: Path) -> str | None:
    """What ``path`` (links followed) is when it exists and is neither a regular file nor a
    stream (:func:`_is_stream`): a folder, a block device or a socket, which no write replaces."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return None


def _written_file(path: Path) -> Path:
    """The file a write to ``path`` replaces: the target of a symbolic link (written through,
    the link kept), else ``path`` itself."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


@contextmanager
def replacing(*paths: str | Path, overwrite: bool = True) -> Iterator[list[Path]]:
    """Temporaries for ``paths``, moved over them together when the block ends without error.

    Write each temporary in the block (create it by name: it does not exist yet). At the end
    each is flushed to disk, given ordinary permissions and renamed over its path, in order, so
    several files (a run's ``best`` and ``last`` checkpoints) change together or not at all,
    but for the renames themselves. A path that is a symbolic link is written through (its
    target replaced, the link kept); a character device or a pipe is written into, its
    temporary kept in the system's temporary folder. On any error every temporary is removed,
    and an OSError becomes a one-line :class:`WriteError`; a folder, a block device or a
    socket is refused before the block. ``overwrite=False`` refuses existing paths
    (FileExistsError), streams excepted: writing into them replaces nothing.
    """
    given = [Path(path) for path in paths]
    streams = [_is_stream(path) for path in given]
    files = [path if stream else _written_file(path) for path, stream in zip(given, streams)]
    for path in files:
        what = _not_a_file(path)
        if what is not None:
            raise WriteError(errno.EISDIR if what == "a folder" else errno.EINVAL,
                             f"{path} is {what}, not a file; nothing was written")
    existed = [path.exists() for path in files]
    if not overwrite:
        refuse_existing(path for path, stream in zip(files, streams) if not stream)
    temporaries = [temporary_path(Path(tempfile.gettempdir()) / path.name if stream else path)
                   for path, stream in zip(files, streams)]
    current = None  # the path being written when an error comes
    try:
        yield temporaries
        mode = new_file_mode()
        for path, tmp, stream in zip(files, temporaries, streams):
            current = path
            if not stream:
                _fsync(tmp)
                os.chmod(tmp, mode)
        for path, tmp, stream in zip(files, temporaries, streams):
            current = path
            if stream:
                with open(tmp, "rb") as source, open(path, "wb") as sink:
                    shutil.copyfileobj(source, sink)
            else:
                _publish(tmp, path, overwrite)
        for folder in dict.fromkeys(path.parent for path, stream in zip(files, streams) if not stream):
            _fsync(folder)  # make the renames themselves durable
    except FileExistsError:
        raise
    except OSError as error:
        if isinstance(error, WriteError):
            raise
        if current is None:  # in the block, which writes the temporaries in order: the newest one's path
            current = next((path for path, tmp in zip(files[::-1], temporaries[::-1]) if tmp.exists()), files[0])
        raise _write_error(current, error, existed[files.index(current)]) from error
    finally:
        for tmp in temporaries:
            tmp.unlink(missing_ok=True)


def save_figure(figure: Any, *paths: str | Path, **options: Any) -> list[Path]:
    """Save the matplotlib ``figure`` to each of ``paths`` atomically and together (see
    :func:`replacing`), in the format each one's suffix names (PNG without one); ``options``
    go to ``figure.savefig`` (``dpi``, ``bbox_inches``). Returns the paths."""
    files = [Path(path) for path in paths]
    with replacing(*files) as temporaries:
        for tmp, path in zip(temporaries, files):
            figure.savefig(tmp, format=path.suffix[1:] or "png", **options)
    return files


def write_atomic(path: str | Path, data: bytes | str, *, overwrite: bool = True) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically (see :func:`replacing`); returns ``path``."""
    path = Path(path)
    with replacing(path, overwrite=overwrite) as (tmp,):
        with open(tmp, "xb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def refuse_existing(paths: Iterable[str | Path], what: str = "", flag: str = "--overwrite",
                    option: str = "--output") -> None:
    """Raise FileExistsError naming the ``paths`` that exist (``what`` they are), ``flag`` and
    the ``option`` that named them."""
    found = [str(path) for path in paths if Path(path).exists()]
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        holds = f" ({what})" if what else ""
        raise FileExistsError(errno.EEXIST, f"{shown} already exist{'s' if len(found) == 1 else ''}{holds}; "
                                            f"pass {flag} to replace, or choose another {option}")


def check_output_file(path: str | Path, option: str, overwrite: bool) -> None:
    """Raise ValueError, before a command's work, when the file ``path`` (given as ``option``)
    cannot be written there: a folder, a block device or a socket, or a file in a folder that
    does not exist; and FileExistsError for an existing file unless ``overwrite``
    (:func:`refuse_existing`). A character device or a pipe (``/dev/null``, ``/dev/stdout``, a
    FIFO) is written into (:func:`replacing`): nothing to refuse."""
    given = Path(path).expanduser()
    if _is_stream(given):
        return
    what = _not_a_file(given)
    if what is not None:
        raise ValueError(f"{option} {path} is {what}, not a file; give the file to write")
    folder = _written_file(given).parent
    if not folder.is_dir():
        state = "is not a folder" if folder.exists() else "does not exist"
        raise ValueError(f"{option} {path}: its folder {folder} {state}; create it, or give a file in a folder "
                         "that exists")
    if not overwrite:
        refuse_existing([given], option, option=option)


def clear_results(folder: str | Path, patterns: Iterable[str], *, overwrite: bool, what: str) -> None:
    """Make ``folder`` ready for a command's results, before the command does its work.

    The files of ``folder`` matching ``patterns`` (globs: the names the command writes) are its
    earlier results: without ``overwrite`` they are refused (FileExistsError naming them and
    ``--overwrite``); with it they are removed, so that no result of the earlier run (a figure
    the new one does not draw) stays beside the new ones. Other files are never touched.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"--output {folder} is a file, not a folder; choose another --output")
    found = sorted({path for pattern in patterns for path in folder.glob(pattern) if path.is_file()})
    if found and not overwrite:
        refuse_existing(found, f"results of an earlier {what}")
    for path in found:
        path.unlink()


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat_file:
            return stat_file.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


#: The largest process id any system gives (a C ``pid_t``); Linux's are at most 2**22.
_PID_LIMIT = 2**31 - 1


def _possible_pid(pid: Any) -> TypeGuard[int]:
    """Whether ``pid`` (a lock's record) can be a process's id: an integer from 1 to :data:`_PID_LIMIT`
    (0 and negative ids name process groups, to which ``kill`` would answer for others)."""
    return isinstance(pid, int) and not isinstance(pid, bool) and 1 <= pid <= _PID_LIMIT


def _owner_gone(owner: dict[str, Any], beat_age: float) -> str | None:
    """Why the owner of a lock (its record, its heartbeat ``beat_age`` seconds old) is gone, or
    None when it may be alive. A process of this host is asked directly: alive, it keeps the
    lock whatever its heartbeat's age (a run paused with Ctrl-Z beats no more). An owner on
    another host is gone when it was an earlier run of this SLURM job or its heartbeat stopped."""
    pid, job, mine = owner.get("pid"), owner.get("slurm_job"), _slurm_job()
    if owner.get("host") == socket.gethostname():
        return "it no longer runs" if _possible_pid(pid) and not _alive(pid, owner.get("process_start")) else None
    if isinstance(job, dict) and mine is not None and job.get("id") == mine["id"] \
            and str(job.get("restart")) != mine["restart"]:
        return f"an earlier run of SLURM job {mine['id']}, which ended before the job was requeued"
    if owner.get("heartbeat_s") and beat_age > LOCK_STALE_AFTER_S:
        return f"its heartbeat stopped {beat_age:.0f} s ago (a lock is stale after {LOCK_STALE_AFTER_S:.0f} s)"
    return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    current = _process_start(pid)
    return start is None or current is None or current == start


#: Seconds between a lock's heartbeats: its holder touches it (the file's modification time).
LOCK_HEARTBEAT_S = 60.0
#: A lock whose heartbeat is older than this (seconds) belongs to a run that is gone (killed on
#: another machine, its machine lost) and is taken over: ten missed heartbeats.
LOCK_STALE_AFTER_S = 600.0


def _slurm_job() -> dict[str, str] | None:
    """This process's SLURM job id and restart count (``SLURM_RESTART_COUNT``, 0 before a
    requeue), None outside SLURM."""
    job = os.environ.get("SLURM_JOB_ID")
    return None if job is None else {"id": job, "restart": os.environ.get("SLURM_RESTART_COUNT", "0")}


#: How far in the future (seconds) a lock's heartbeat may lie before it is said to be there: a
#: file system's clock a little ahead of this machine's is usual.
_CLOCK_SLACK_S = 5.0


class FolderLock:
    """``FOLDER/.ssog-run.lock``, created with ``O_EXCL``: the folder belongs to this process.

    The lock holds the owner's pid, host, process start, command and SLURM job, and a
    heartbeat: the holder touches it every :data:`LOCK_HEARTBEAT_S` seconds (a daemon thread)
    until :meth:`release` removes it. A lock whose owner is provably gone is taken over, and
    :attr:`note` says so: on this host, a process that no longer runs (one that runs keeps its
    lock whatever its heartbeat's age: a run paused with Ctrl-Z beats no more); on another, an
    earlier run of this SLURM job (a requeued job starts only once the earlier one ended), or
    an owner whose heartbeat is older than :data:`LOCK_STALE_AFTER_S` (killed on another
    machine). Of several processes taking over one lock, the one that moves that very lock
    away wins; the others find the winner's. Any other lock is a FileExistsError naming its
    process (or why the file is no lock ssog wrote). :meth:`release` removes this lock only,
    never one that another process took over meanwhile.
    """

    NAME = ".ssog-run.lock"

    def __init__(self, folder: str | Path, what: str = "run"):
        self.path = Path(folder) / self.NAME
        self.note: str | None = None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "process_start": _process_start(os.getpid()),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "what": what, "heartbeat_s": LOCK_HEARTBEAT_S,
                  "slurm_job": _slurm_job(), "token": secrets.token_hex(8)}  # tells this lock from a later one
        self._payload = (json.dumps(record) + "\n").encode()
        self._released = threading.Event()
        for _ in range(3):
            try:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                self._take_over_or_refuse(folder)
                continue
            try:
                os.write(descriptor, self._payload)
            except BaseException:  # a full disk: no empty lock left to refuse the next run
                os.close(descriptor)
                self.path.unlink(missing_ok=True)
                raise
            os.close(descriptor)
            threading.Thread(target=self._beat, name="ssog-lock-heartbeat", daemon=True).start()
            return
        raise FileExistsError(errno.EEXIST, f"{folder} is being claimed by another process at this moment; "
                                            "try again, or choose another --output")

    def _holds(self) -> bool:
        """Whether the folder's lock is still this one: not removed, not taken over."""
        try:
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            return os.read(descriptor, len(self._payload) + 1) == self._payload
        except OSError:
            return False
        finally:
            os.close(descriptor)

    def _beat(self) -> None:
        while not self._released.wait(LOCK_HEARTBEAT_S):
            if not self._holds():
                continue  # removed or taken over: another run's heartbeat is not ours to give
            try:
                os.utime(self.path)
            except OSError:  # removed from under us, or the storage is away for a moment
                pass

    def _take_over_or_refuse(self, folder: str | Path) -> None:
        try:  # the record and its heartbeat from one open file: both of the same lock
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return  # released meanwhile: try again
        except OSError as error:
            if not self.path.is_symlink():
                raise
            state = "a symbolic link" if self.path.exists() else "a dangling symbolic link"
            raise FileExistsError(errno.EEXIST, f"{self.path} is {state} (to {os.readlink(self.path)}), not a lock "
                                                f"ssog wrote; if no run uses {folder}, remove it") from error
        with os.fdopen(descriptor, "rb") as handle:
            beat_age = time.time() - os.fstat(handle.fileno()).st_mtime
            try:
                content = handle.read()
            except OSError:  # a folder of that name
                content = b""
        try:
            owner = json.loads(content)
        except (ValueError, RecursionError):
            owner = {}
        owner = owner if isinstance(owner, dict) else {}
        pid, host = owner.get("pid"), owner.get("host")
        if owner and not _possible_pid(pid):
            raise FileExistsError(errno.EEXIST, f"{self.path} names process {pid!r}, which no process can be: it is "
                                                f"not a lock ssog wrote; if no run uses {folder}, remove it")
        gone = _owner_gone(owner, beat_age)
        if gone is not None:
            stale = self.path.with_name(f"{self.NAME}.{os.getpid()}-{secrets.token_hex(4)}{TEMP_MARK}")
            try:
                os.rename(self.path, stale)  # only one of several processes taking over moves this lock
            except FileNotFoundError:
                return
            if stale.read_bytes() != content:  # another process took it over first: that lock is its, put it back
                with suppress(FileExistsError):
                    _publish(stale, self.path, overwrite=False)
                stale.unlink(missing_ok=True)
                return
            stale.unlink(missing_ok=True)
            self.note = (f"note: took over {folder} from process {pid} on {host}, which started a "
                         f"{owner.get('what', 'run')} there at {owner.get('started', '?')}: {gone}")
            return
        who = f"process {pid} on {host}" if pid is not None else "another process"
        if host == socket.gethostname():
            after = "it runs on this machine, and the lock of a running process is never taken over"
        elif not owner.get("heartbeat_s"):  # written before heartbeats: the lock's age says nothing
            after = f"if that process is gone, remove {self.path}"
        elif beat_age < -_CLOCK_SLACK_S:
            after = (f"its heartbeat is {-beat_age:.0f} s in the future: this machine's clock and the clock that "
                     f"stamped the lock disagree; a lock whose heartbeat is older than {LOCK_STALE_AFTER_S:.0f} s "
                     "is taken over")
        else:
            after = (f"its heartbeat is {max(beat_age, 0.0):.0f} s old; a lock whose heartbeat is older than "
                     f"{LOCK_STALE_AFTER_S:.0f} s is taken over")
        raise FileExistsError(
            errno.EEXIST,
            f"{folder} is in use by {who} ({owner.get('what', 'run')} started {owner.get('started', '?')}); "
            f"wait for it to end or choose another --output ({after})",
        )

    def release(self) -> None:
        """Stop the heartbeat and remove the lock, unless it is no longer this one (taken over)."""
        self._released.set()
        if self._holds():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holds_lock(folder: str | Path) -> bool:
    """Whether ``FOLDER``'s :class:`FolderLock` is this process's: a run checks it before it
    writes, so a run whose folder was removed or taken over writes nothing there."""
    try:
        owner = json.loads((Path(folder) / FolderLock.NAME).read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return (isinstance(owner, dict) and owner.get("pid") == os.getpid()
            and owner.get("host") == socket.gethostname())
