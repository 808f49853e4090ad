#!/usr/bin/env python3
"""parallel-lab trainer entrypoint: runs the command (by default `dvc repro`) as the owner
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

Signals. compose's `init: true` makes tini PID 1, and tini hands SIGTERM (docker stop) or
SIGINT to its one child: this process. It passes the signal on to the command's process
group: `dvc repro`, the stage's shell and `python -m pipeline.train`, whose launcher relays
it to torchrun and the ranks, which checkpoint before exiting. DVC itself dies of the
SIGTERM at once; its stage carries on, re-parented to this process (a child subreaper), and
this process only exits, with the command's status, once every descendant has, so the
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
PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)


def drop_to_workspace_owner() -> None:
    if os.getuid() != 0 or not os.path.isdir(WORKSPACE):
        return
    info = os.stat(WORKSPACE)
    uid, gid = info.st_uid, info.st_gid
    if uid == 0:
        return
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


def main(argv: list[str]) -> int:
    if not argv:
        print("parallel-lab-entrypoint: no command given", file=sys.stderr)
        return 2
    drop_to_workspace_owner()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    interactive = os.isatty(0)

    def in_child() -> None:
        # A process group of its own, so that a signal reaches all of it and none of this
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
    signalled = False

    def forward(signum, frame) -> None:
        nonlocal signalled
        signalled = True
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass  # the group is gone: nothing left to tell

    for signum in FORWARDED:
        signal.signal(signum, forward)

    status = None
    while True:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            break  # no descendants left
        if pid == child.pid:
            status = os.waitstatus_to_exitcode(raw)
            if not signalled:
                break
    return 128 - status if status < 0 else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
