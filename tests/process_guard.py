"""The test tiers' guard: a test that starts a process says so (`@pytest.mark.service`), or fails.

`make test-unit` runs the tests marked neither `service` nor `slow`, without a process; that promise holds
only if no unmarked test starts a process. So, in every run, while a test without the `service` marker
runs (its setup, call and teardown), starting a process raises ProcessStarted: subprocess (and so
asyncio's subprocesses), os.fork and posix_spawn, and multiprocessing. A test that catches the error
still fails at its end. `--process-guard=record FILE` records the offenders (nodeid per line) instead
of failing them: how the markers were found.
"""
from __future__ import annotations

import contextlib
import contextvars
import multiprocessing.process
import os
import subprocess

import pytest

MARKER = "service"


class ProcessStarted(RuntimeError):
    """An unmarked test started a process."""


_FIXTURE = contextvars.ContextVar("fixture", default="")  # the fixture being set up, if any


@contextlib.contextmanager
def guarded(nodeid: str, offences: list[str], fail: bool):
    """Every way this interpreter starts a process, patched to note `nodeid` (and raise, when `fail`)."""
    def refuse(what: str):
        fixture = _FIXTURE.get()
        offences.append(f"{what} in fixture {fixture}" if fixture else what)
        if fail:
            raise ProcessStarted(f"{nodeid} started a process ({what}) without @pytest.mark.{MARKER}: mark it, "
                                 f"or keep it in-process (make test-unit runs no process)")

    originals = []

    def patch(owner, name, what):
        real = getattr(owner, name, None)
        if real is None:
            return
        originals.append((owner, name, real))

        def wrapper(*args, **kwargs):
            refuse(what)
            return real(*args, **kwargs)
        setattr(owner, name, wrapper)

    patch(subprocess.Popen, "_execute_child", "subprocess")
    patch(os, "fork", "os.fork")
    patch(os, "posix_spawn", "os.posix_spawn")
    patch(os, "posix_spawnp", "os.posix_spawnp")
    patch(multiprocessing.process.BaseProcess, "start", "multiprocessing")
    try:
        yield
    finally:
        for owner, name, real in reversed(originals):
            setattr(owner, name, real)


def addoption(parser) -> None:
    parser.addoption("--process-guard", default="fail", metavar="fail|off|record:FILE",
                     help="unmarked tests that start a process: fail them (default), let them, or record "
                          "their node ids in FILE")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    mode = item.config.getoption("--process-guard")
    if mode == "off" or item.get_closest_marker(MARKER) is not None:
        yield
        return
    offences: list[str] = []
    item.stash[OFFENCES] = offences
    with guarded(item.nodeid, offences, fail=mode == "fail"):
        yield
    if offences and mode.startswith("record:"):
        with open(mode.split(":", 1)[1], "a") as out:
            out.write(f"{item.nodeid}\t{','.join(sorted(set(offences)))}\n")


OFFENCES = pytest.StashKey[list]()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Note which fixture a process starts in (what --process-guard=record reports)."""
    token = _FIXTURE.set(fixturedef.argname)
    try:
        yield
    finally:
        _FIXTURE.reset(token)


def mark_services(items, fixtures: frozenset[str]) -> None:
    """Every test that uses a fixture that starts a process (directly or through another), and every
    container test (`compose`), is a service test: it is marked so, wherever it is."""
    for item in items:
        drives = item.get_closest_marker("compose") is not None  # containers: docker's processes
        if (drives or fixtures.intersection(getattr(item, "fixturenames", ()))) and item.get_closest_marker(MARKER) is None:
            item.add_marker(MARKER)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test whose code caught ProcessStarted still fails: its report says so."""
    outcome = yield
    report = outcome.get_result()
    offences = item.stash.get(OFFENCES, None)
    if (offences and call.when == "teardown" and item.config.getoption("--process-guard") == "fail"
            and report.passed):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started a process ({', '.join(sorted(set(offences)))}) without "
                           f"@pytest.mark.{MARKER}")
