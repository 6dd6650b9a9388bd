"""ssog.files: atomic writes with ordinary permissions and one-line errors, results never replaced
unasked, run folders locked."""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from ssog import files
from ssog.files import (
    FolderLock, WriteError, clear_results, is_temporary, replacing, save_figure, write_atomic,
)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _full_disk(monkeypatch, after: int = 0):
    """Make ``ssog.files``' writes fail with ENOSPC once ``after`` bytes are written."""
    real_open = open

    class Full:
        def __init__(self, handle):
            self.handle, self.written = handle, 0

        def write(self, data):
            if self.written + len(data) > after:
                self.handle.write(data[: max(0, after - self.written)])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.written += len(data)
            return self.handle.write(data)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

    monkeypatch.setattr(files, "open", lambda *a, **k: Full(real_open(*a, **k)), raising=False)


def test_write_atomic_gives_ordinary_permissions_and_leaves_no_temporary(tmp_path, umask_022):
    path = write_atomic(tmp_path / "a.json", "{}")
    assert path.read_text() == "{}"
    assert path.stat().st_mode & 0o777 == 0o644
    os.chmod(path, 0o600)  # replacing a file gives the new one ordinary permissions again
    write_atomic(path, b"[]")
    assert path.read_bytes() == b"[]" and path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_disk_full_keeps_the_previous_file_in_one_line(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("previous")
    _full_disk(monkeypatch, after=3)
    with pytest.raises(WriteError) as caught:
        write_atomic(path, "new contents")
    assert str(caught.value) == f"disk full (ENOSPC) writing {path}; the previous file is kept"
    assert caught.value.errno == errno.ENOSPC
    assert path.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # the partial temporary is gone
    with pytest.raises(WriteError, match="writing .*last; nothing was written"):  # the file being written is named
        with replacing(tmp_path / "best", tmp_path / "last") as (best, last):
            best.write_bytes(b"123")
            with files.open(last, "xb") as handle:
                handle.write(b"full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
    with pytest.raises(WriteError, match="nothing was written"):
        write_atomic(tmp_path / "new.json", "new contents")
    assert not (tmp_path / "new.json").exists()


def test_files_written_together_change_together(tmp_path):
    first, second = tmp_path / "best", tmp_path / "last"
    first.write_text("old best")
    second.write_text("old last")
    with pytest.raises(RuntimeError, match="failed"):
        with replacing(first, second) as (tmp_first, tmp_second):
            tmp_first.write_text("new best")
            raise RuntimeError("writing last failed")
    assert (first.read_text(), second.read_text()) == ("old best", "old last")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "last"]


def test_figures_are_saved_atomically_in_the_format_of_their_suffix(tmp_path):
    from matplotlib.figure import Figure

    figure = Figure(figsize=(2, 2))
    figure.subplots().plot([0, 1], [1, 0])
    paths = save_figure(figure, tmp_path / "fig.png", tmp_path / "fig.pdf", tmp_path / "curves", dpi=50)
    assert [path.read_bytes()[:4] for path in paths] == [b"\x89PNG", b"%PDF", b"\x89PNG"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves", "fig.pdf", "fig.png"]


def test_no_overwrite_refuses_an_existing_file(tmp_path):
    path = tmp_path / "metrics.json"
    write_atomic(path, "1", overwrite=False)
    with pytest.raises(FileExistsError, match=r"metrics.json already exists.*--overwrite"):
        write_atomic(path, "2", overwrite=False)
    assert path.read_text() == "1"


def test_clear_results_refuses_or_removes_only_the_commands_files(tmp_path):
    (tmp_path / "results.json").write_text("earlier")
    (tmp_path / "fig1.png").write_text("earlier figure")
    (tmp_path / "notes.txt").write_text("the user's")
    with pytest.raises(FileExistsError, match=r"results.json.*already exist \(results of an earlier ssog bench\); "
                                              r"pass --overwrite"):
        clear_results(tmp_path, ["results.json", "fig*.png"], overwrite=False, what="ssog bench")
    assert (tmp_path / "results.json").exists()
    clear_results(tmp_path, ["results.json", "fig*.png"], overwrite=True, what="ssog bench")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    clear_results(tmp_path / "new", ["results.json"], overwrite=False, what="ssog bench")  # nothing there yet


def test_a_folder_lock_is_exclusive_and_released(tmp_path):
    with FolderLock(tmp_path) as lock:
        record = json.loads(lock.path.read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        with pytest.raises(FileExistsError, match=rf"is in use by process {os.getpid()} on "):
            FolderLock(tmp_path)
    assert not lock.path.exists()
    FolderLock(tmp_path).release()


def test_a_lock_that_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    def full(descriptor, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(files.os, "write", full)
        with pytest.raises(OSError, match="No space left"):
            FolderLock(tmp_path)
    assert not (tmp_path / FolderLock.NAME).exists()  # an empty lock would refuse the next run as "in use"
    FolderLock(tmp_path).release()


def test_the_lock_of_a_dead_process_is_taken_over_with_a_note(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    (tmp_path / FolderLock.NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname(),
                                                        "started": "earlier", "what": "training run"}))
    lock = FolderLock(tmp_path)
    assert lock.note and f"took over {tmp_path} from process {pid}" in lock.note
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    lock.release()
    # a lock held on another machine is never taken over: that process may be alive
    (tmp_path / FolderLock.NAME).write_text(json.dumps({"pid": pid, "host": "elsewhere", "started": "earlier"}))
    with pytest.raises(FileExistsError, match=f"in use by process {pid} on elsewhere"):
        FolderLock(tmp_path)



def _foreign_lock(folder, heartbeat_age: float, **record) -> None:
    """A lock of a live-looking process on another machine (``record`` changes it) whose heartbeat is
    ``heartbeat_age`` s old."""
    path = folder / FolderLock.NAME
    path.write_text(json.dumps({"pid": 4242, "host": "node17", "started": "earlier", "what": "training run",
                                "heartbeat_s": files.LOCK_HEARTBEAT_S, **record}))
    then = time.time() - heartbeat_age
    os.utime(path, (then, then))


def test_a_lock_of_another_machine_is_taken_over_once_its_heartbeat_is_stale(tmp_path):
    _foreign_lock(tmp_path, heartbeat_age=60)
    with pytest.raises(FileExistsError, match=rf"in use by process 4242 on node17 .*its heartbeat is 60 s old; a lock "
                                              rf"whose heartbeat is older than {files.LOCK_STALE_AFTER_S:.0f} s is "
                                              "taken over"):
        FolderLock(tmp_path)
    _foreign_lock(tmp_path, heartbeat_age=files.LOCK_STALE_AFTER_S + 5)
    with FolderLock(tmp_path) as lock:
        assert re.fullmatch(rf"note: took over {tmp_path} from process 4242 on node17, which started a training run "
                            rf"there at earlier: its heartbeat stopped \d+ s ago \(a lock is stale after "
                            rf"{files.LOCK_STALE_AFTER_S:.0f} s\)", lock.note), lock.note
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    # a lock written before heartbeats (no heartbeat_s) is never taken over for its age
    (tmp_path / FolderLock.NAME).write_text(json.dumps({"pid": 4242, "host": "node17", "started": "earlier"}))
    os.utime(tmp_path / FolderLock.NAME, (0, 0))
    with pytest.raises(FileExistsError, match="if that process is gone, remove"):
        FolderLock(tmp_path)


def test_a_requeued_slurm_job_takes_over_the_lock_of_its_earlier_run_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "981")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    _foreign_lock(tmp_path, heartbeat_age=1, slurm_job={"id": "981", "restart": "1"})  # this very run of the job
    with pytest.raises(FileExistsError, match="in use by process 4242 on node17"):
        FolderLock(tmp_path)
    _foreign_lock(tmp_path, heartbeat_age=1, slurm_job={"id": "980", "restart": "0"})  # another job
    with pytest.raises(FileExistsError, match="in use by process 4242 on node17"):
        FolderLock(tmp_path)
    _foreign_lock(tmp_path, heartbeat_age=1, slurm_job={"id": "981", "restart": "0"})
    with FolderLock(tmp_path) as lock:
        assert lock.note.endswith("an earlier run of SLURM job 981, which ended before the job was requeued")
        assert json.loads(lock.path.read_text())["slurm_job"] == {"id": "981", "restart": "1"}


def test_a_held_lock_beats_until_released(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "LOCK_HEARTBEAT_S", 0.05)
    lock = FolderLock(tmp_path)
    os.utime(lock.path, (0, 0))
    deadline = time.monotonic() + 30
    while lock.path.stat().st_mtime == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lock.path.stat().st_mtime > time.time() - 60
    lock.release()
    time.sleep(0.2)
    assert not lock.path.exists()  # the heartbeat never recreates a released lock

def test_a_lock_of_a_live_process_of_this_host_is_never_taken_over(tmp_path):
    paused = subprocess.Popen(["sleep", "60"])  # a run paused with Ctrl-Z: alive, and its heartbeat stopped
    try:
        os.kill(paused.pid, signal.SIGSTOP)
        _foreign_lock(tmp_path, heartbeat_age=10 * files.LOCK_STALE_AFTER_S, pid=paused.pid,
                      host=socket.gethostname())
        with pytest.raises(FileExistsError, match=rf"in use by process {paused.pid} on {socket.gethostname()} .*"
                                                  r"\(it runs on this machine, and the lock of a running process is "
                                                  r"never taken over\)"):
            FolderLock(tmp_path)
        assert json.loads((tmp_path / FolderLock.NAME).read_text())["pid"] == paused.pid
    finally:
        paused.kill()
        paused.wait()
    with FolderLock(tmp_path) as lock:  # once it has ended, its lock is taken over at once
        assert lock.note.endswith("it no longer runs")


def test_of_two_processes_taking_over_one_stale_lock_one_wins(tmp_path, monkeypatch):
    _foreign_lock(tmp_path, heartbeat_age=files.LOCK_STALE_AFTER_S + 5)
    rename, first = os.rename, []

    def the_other_took_it_over_first(source, target):
        # both judged the lock stale; the other process moved it away and wrote its own before this one moves it
        monkeypatch.setattr(files.os, "rename", rename)
        first.append(FolderLock(tmp_path))
        return rename(source, target)

    monkeypatch.setattr(files.os, "rename", the_other_took_it_over_first)
    with pytest.raises(FileExistsError, match=f"in use by process {os.getpid()} on "):
        FolderLock(tmp_path)
    winner = first[0]
    assert winner.note and "heartbeat stopped" in winner.note
    assert (tmp_path / FolderLock.NAME).read_bytes() == winner._payload  # the winner's lock is where it was
    assert [p.name for p in tmp_path.iterdir()] == [FolderLock.NAME]  # and nothing else is left
    winner.release()
    assert not (tmp_path / FolderLock.NAME).exists()


def test_release_removes_only_its_own_lock(tmp_path):
    lock = FolderLock(tmp_path)
    # its machine lost, another run took the folder over; then this one ends and releases
    _foreign_lock(tmp_path, heartbeat_age=0)
    taken = (tmp_path / FolderLock.NAME).read_bytes()
    lock.release()
    assert (tmp_path / FolderLock.NAME).read_bytes() == taken
    assert not files.holds_lock(tmp_path)


@pytest.mark.parametrize("pid", [-1, 0, 2**80, True, "4242", None])
def test_a_lock_naming_an_impossible_process_is_one_line(pid, tmp_path):
    (tmp_path / FolderLock.NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "heartbeat_s": 60}))
    with pytest.raises(FileExistsError) as caught:
        FolderLock(tmp_path)
    assert str(caught.value) == (f"[Errno 17] {tmp_path / FolderLock.NAME} names process {pid!r}, which no process "
                                 f"can be: it is not a lock ssog wrote; if no run uses {tmp_path}, remove it")
    assert (tmp_path / FolderLock.NAME).exists()


def test_a_heartbeat_in_the_future_is_said_to_be_there(tmp_path):
    _foreign_lock(tmp_path, heartbeat_age=-3600)  # the clock that stamped it is an hour ahead of this machine's
    with pytest.raises(FileExistsError, match=r"in use by process 4242 on node17 .*\(its heartbeat is 3600 s in the "
                                              r"future: this machine's clock and the clock that stamped the lock "
                                              "disagree; "):
        FolderLock(tmp_path)


@pytest.mark.parametrize("target", ["gone", "notes.txt"])
def test_a_lock_that_is_a_symbolic_link_is_named_as_such(target, tmp_path):
    (tmp_path / "notes.txt").write_text("the user's")
    (tmp_path / FolderLock.NAME).symlink_to(target)
    state = "a dangling symbolic link" if target == "gone" else "a symbolic link"
    with pytest.raises(FileExistsError, match=re.escape(f"{tmp_path / FolderLock.NAME} is {state} (to {target}), not "
                                                        f"a lock ssog wrote; if no run uses {tmp_path}, remove it")):
        FolderLock(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "the user's"


def test_a_link_is_written_through_and_kept(tmp_path):
    (tmp_path / "results").mkdir()
    target = tmp_path / "results" / "metrics.json"
    target.write_text("earlier")
    link = tmp_path / "metrics.json"
    link.symlink_to(target)
    with pytest.raises(FileExistsError, match="already exists"):
        write_atomic(link, "new", overwrite=False)
    write_atomic(link, "new")
    assert link.is_symlink() and link.read_text() == target.read_text() == "new"
    dangling = tmp_path / "later.json"
    dangling.symlink_to(tmp_path / "results" / "later.json")
    write_atomic(dangling, "first", overwrite=False)
    assert dangling.is_symlink() and (tmp_path / "results" / "later.json").read_text() == "first"
    assert not [p for p in (tmp_path / "results").iterdir() if is_temporary(p)]


def test_a_pipe_is_written_into_never_replaced(tmp_path):
    fifo = tmp_path / "metrics.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    write_atomic(fifo, "through the pipe", overwrite=False)  # nothing stored is replaced: no --overwrite needed
    reader.join(timeout=30)
    assert received == ["through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.fifo"]
    files.check_output_file(fifo, "--output", overwrite=False)


def test_a_folder_or_a_socket_is_never_replaced_by_a_file(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(WriteError, match=f"{folder} is a folder, not a file; nothing was written"):
        write_atomic(folder, "x")
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(tmp_path / "s.sock"))
        with pytest.raises(WriteError, match="s.sock is a socket, not a file"):
            write_atomic(tmp_path / "s.sock", "x")
        assert stat.S_ISSOCK(os.lstat(tmp_path / "s.sock").st_mode)
    finally:
        server.close()


def test_an_output_file_is_checked_before_the_work(tmp_path):
    check = files.check_output_file
    with pytest.raises(ValueError, match=f"--dry-run-report {tmp_path} is a folder, not a file; give the file"):
        check(tmp_path, "--dry-run-report", overwrite=True)
    with pytest.raises(ValueError, match=f"--output {tmp_path}/no/r.json: its folder {tmp_path}/no does not exist"):
        check(tmp_path / "no" / "r.json", "--output", overwrite=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=f"its folder {tmp_path}/file is not a folder"):
        check(tmp_path / "file" / "r.json", "--output", overwrite=False)
    with pytest.raises(FileExistsError, match="file already exists"):
        check(tmp_path / "file", "--output", overwrite=False)
    check(tmp_path / "file", "--output", overwrite=True)
    check(tmp_path / "new.json", "--output", overwrite=False)


def test_temporaries_are_marked():
    assert is_temporary(".last.safetensors.123-abcd.ssog-tmp.safetensors")
    assert not is_temporary("model.tmp")
