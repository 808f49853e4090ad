#!/usr/bin/env python3
"""parallel-lab trainer entrypoint: runs the command (by default `dvc repro`, then
`python -m pipeline.publish`) as the owner
of /workspace, and sees a `docker stop` through to the training processes.

Who runs it. compose bind-mounts the repository at /workspace, and dvc.lock, results/,
reports/ and checkpoints/ must belong to whoever owns the work tree on the host, whatever
their uid, with nothing to configure. So the container starts as root and this drops to the
uid and gid that own /workspace (no supplementary groups), giving a uid without an account in
the image a HOME of its own under /tmp (git, DVC, matplotlib and torch keep config and
caches there) and a USER (getpass.getuser(), which DVC and torch call, fails for a uid with
no passwd entry). Started as a non-root user (`docker run --user ...`), that choice stands.
/workspace owned by root: it stays root (under rootless Docker or Podman the host user *is*
root in the container, and a root-owned tree wants root anyway).

Signals. compose's `init: true` makes tini PID 1, and tini hands SIGTERM (docker stop,
`docker compose stop`) or SIGINT to its one child: this process. It passes the signal on to
every process of the command's process group (the stage's shell, `python -m pipeline.train`,
whose launcher relays it to torchrun and the ranks, which checkpoint before exiting), and
keeps doing so for processes that appear there afterwards, except that DVC gets SIGINT
instead: a SIGTERM kills DVC on the spot, leaving its lock (.dvc/tmp/rwlock) behind, and as
PIDs in a container repeat, the next `dvc repro` then finds it "blocked" by a live process.
SIGINT is what DVC expects (Ctrl-C): it ignores it while a stage runs, then fails that stage
and exits 255, its lock released; between stages it stops at once, also cleanly. A shell
(the image's default command is `sh -c "dvc repro && python -m pipeline.publish"`) is left
alone: it ends when the command it waits for does, with that command's status, where SIGTERM
(or SIGINT: dash does not wait for its command then) would end it at once with 143 or 130,
hiding DVC's 255; a command it starts afterwards is signalled as it appears. This
process is a child subreaper (what the stage leaves behind is re-parented to it) and, once
signalled, exits only when every descendant has, with the command's exit status, so the
container (whose end kills whatever is left) outlives the checkpoint. Without a signal the
command's exit ends the container at once, as it would without this process.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import signal
import subprocess
import sys

WORKSPACE = "/workspace"
# compose mounts the default DVC remote (.dvc/config) here, beside /workspace
DVC_REMOTE = "/parallel-lab-dvc-remote"
PR_SET_CHILD_SUBREAPER = 36
SHELLS = {"sh", "dash", "bash"}
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def give_new_remote_to(uid: int, gid: int) -> None:
    """Docker creates a bind mount's missing host directory as root: the remote's, made so on
    the first `up`, is then empty and root's, and the repository's owner could push to it
    neither here nor on the host. Such a one becomes theirs; any other is left as it is."""
    try:
        info = os.stat(DVC_REMOTE)
    except FileNotFoundError:
        return  # not mounted (docker run without compose)
    if info.st_uid == 0 and not os.listdir(DVC_REMOTE):
        os.chown(DVC_REMOTE, uid, gid)


def drop_to_workspace_owner() -> None:
    if os.getuid() != 0 or not os.path.isdir(WORKSPACE):
        return
    info = os.stat(WORKSPACE)
    uid, gid = info.st_uid, info.st_gid
    if uid == 0:
        return
    give_new_remote_to(uid, gid)
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        account = None
    home = account.pw_dir if account else ""
    if not (home and os.path.isdir(home) and os.stat(home).st_uid == uid):
        home = f"/tmp/home-{uid}"
        os.makedirs(home, exist_ok=True)
        os.chown(home, uid, gid)
    os.environ["HOME"] = home
    os.environ.setdefault("USER", account.pw_name if account else "parallel-lab")
    os.environ["LOGNAME"] = os.environ["USER"]
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def group_members(pgid: int) -> dict[int, str]:
    """pid -> start time of each process in process group `pgid` (from /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # after "pid (comm)": state ppid pgrp ... starttime is the 20th
        if int(fields[2]) == pgid:
            found[int(entry)] = fields[19]
    return found


def is_dvc(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return False
    # `dvc ...` as a console script (its interpreter comes first) or `python -m dvc ...`
    return any(os.path.basename(a) == "dvc" for a in argv[:2]) or argv[1:3] == ["-m", "dvc"]


def is_shell(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() in SHELLS
    except OSError:
        return False


def tell(pgid: int, signum: int, told: set[tuple[int, str]]) -> None:
    """Send `signum` (SIGINT to DVC, nothing to a shell) to each member of the group not
    told yet."""
    for pid, started in group_members(pgid).items():
        if (pid, started) in told:
            continue
        told.add((pid, started))
        if is_shell(pid):
            continue
        dvc_stop = signum in (signal.SIGTERM, signal.SIGINT) and is_dvc(pid)
        try:
            os.kill(pid, signal.SIGINT if dvc_stop else signum)
        except ProcessLookupError:
            pass


def main(argv: list[str]) -> int:
    if not argv:
        print("parallel-lab-entrypoint: no command given", file=sys.stderr)
        return 2
    drop_to_workspace_owner()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    interactive = os.isatty(0)
    # The signals are taken synchronously (sigwaitinfo), so they are blocked here from
    # before the command starts; the command gets the usual, empty mask back.
    watched = {*FORWARDED, signal.SIGCHLD}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)

    def in_child() -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        # A process group of its own, so that a signal can reach all of it and none of this
        # process; an interactive command (`docker compose run ... bash`) takes the terminal.
        os.setpgid(0, 0)
        if interactive:
            previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
            try:
                os.tcsetpgrp(0, os.getpgrp())
            except OSError:
                pass
            signal.signal(signal.SIGTTOU, previous)

    try:
        child = subprocess.Popen(argv, preexec_fn=in_child)  # single-threaded: safe
    except OSError as err:
        print(f"parallel-lab-entrypoint: {argv[0]}: {err.strerror}", file=sys.stderr)
        return 127

    signalled = 0
    told: set[tuple[int, str]] = set()
    status = None
    while True:
        # Once signalled, look for new members of the group now and then as well.
        info = signal.sigtimedwait(watched, 0.25) if signalled else signal.sigwaitinfo(watched)
        if info is not None and info.si_signo != signal.SIGCHLD:
            signalled = info.si_signo
            told.clear()  # a new signal goes to everyone
        while True:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:  # no descendants left
                return 128 - status if status < 0 else status
            if pid == 0:
                break
            if pid == child.pid:
                status = os.waitstatus_to_exitcode(raw)
                if not signalled:
                    return 128 - status if status < 0 else status
        if signalled:
            tell(child.pid, signalled, told)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
