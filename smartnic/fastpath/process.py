"""The fast path's process: standing PUTs fired, checked, issued, completed and re-armed here, away
from the control plane's interpreter lock (see the package's docstring).

Its threads: the main one reads the control plane's messages and forwards statistics every
FLUSH_S; the watcher (smartnic.watcher.TriggerEngine) polls the pools' trigger counters and fires;
the PUT thread gathers, MACs and submits; the fabric clients' I/O threads complete. Nothing else
runs here, so a fire waits for no gRPC call, lookup or eviction pass.
"""
from __future__ import annotations

import logging
import multiprocessing.connection
import os
import signal
import sys
import threading

from hostmem.layout_proto import layout_to_proto
from kvtb import placement
from kvtb.launch import parent_death_signal
from kvtb.logs import setup_logging
from scale import settings as scale_settings
from smartnic.admission import Admission
from smartnic.data_plane import data_plane
from smartnic.datapath import DataError
from smartnic.fastpath import protocol as p
from smartnic.put_path import PutPath
from smartnic.registrations import Registrations
from smartnic.requester import StoredBlock
from smartnic.settings import SmartNicSettings
from smartnic.watcher import engine_of

logger = logging.getLogger("smartnic.fastpath")

SWITCH_INTERVAL_S = 50e-6
FLUSH_S = 0.02  # forwarded statistics wait at most this long (a PUT's end sends them at once)


def die_with_parent() -> None:
    """Linux: SIGKILL this process when the agent that spawned it dies (nothing is left behind)."""
    parent_death_signal(signal.SIGKILL)


class FastPathProcess:
    """The child's state. `serve` runs until STOP or the socket closes."""

    def __init__(self, conn: multiprocessing.connection.Connection, settings: SmartNicSettings):
        self.conn, self.settings = conn, settings
        self._send_lock = threading.Lock()
        self.stats = p.ForwardingStats()
        self.regions = Registrations()
        self.nodes, self.datapath = data_plane(settings)  # its own authenticated connections
        # the control plane's index says what is stored; here a block is admitted on its own sightings
        admission = Admission(settings.admission, settings.admission_max_names)
        self.puts = PutPath(self.datapath, settings.salt, self.stats, admission.admit, self._stored, self.flush)
        self.engine = engine_of(settings, self.regions, self.stats, self._no_data, fire_block=self.puts.fire,
                                watcher_cpus=placement.parse_cpus(settings.fastpath_cpus))
        self.engine.on_block_fire.append(
            lambda reg, block, gen, store_ns, fire_ns: self.stats.fired(reg.region_id, block, gen, store_ns, fire_ns))

    @staticmethod
    def _no_data(reg, entry, done) -> None:  # one-off entries stay with the control plane
        done("internal", "the fast path runs standing PUTs only")

    def send(self, message: tuple) -> None:
        with self._send_lock:
            self.conn.send(message)

    def flush(self) -> None:
        ops = self.stats.take()
        if ops:
            self.send((p.STATS, ops))

    def _stored(self, stored: StoredBlock | None, context_id: str, err: DataError | None) -> None:
        """A PUT ended (fabric I/O thread): its statistics, then the report, before PUT-done moves."""
        self.flush()
        self.send((p.STORED, context_id, stored, err.kind if err else None, str(err) if err else ""))

    def serve(self) -> int:
        self.nodes.start()
        self.engine.start()
        self.send((p.READY, os.getpid(), self.engine.compiled, self.engine._thread.native_id))
        try:
            while True:
                if self.conn.poll(FLUSH_S):
                    message = self.conn.recv()
                    if message[0] == p.STOP:
                        return 0
                    self.handle(message)
                self.flush()
        except (EOFError, OSError):  # the agent went away
            return 0
        finally:
            self.close()

    def handle(self, message: tuple) -> None:
        kind, request = message[0], message[1]
        error = None
        try:
            if kind == p.REGISTER:
                _, _, region_id, name, size, counter_offset, counter_count, layout = message
                self.regions.register(name, size, "fastpath", counter_offset, counter_count,
                                      layout_to_proto(layout) if layout is not None else None, region_id=region_id)
                self.engine.wake()
            elif kind == p.RESTORE:
                return self.restore(*message[1:])
            elif kind == p.DEREGISTER:
                self.engine.flush(message[2])
                self.regions.deregister(message[2], "fastpath")
            else:
                error = f"unknown message {kind!r}"
        except Exception as exc:  # noqa: BLE001 - every request gets its answer
            logger.warning("%s failed: %s", kind, exc)
            error = f"{type(exc).__name__}: {exc}"
        self.send((p.REPLY, request, error))

    def restore(self, restore_id: int, region_id: int, blocks: list, groups: list) -> None:
        """Steps 6 and 7 for the control plane: GET each block layer group by layer group into its pool
        block; each group's GET-done counter is bumped here as it lands and checks out; each block's end is
        reported (ENDED) after its last counter moved. No reply: every block ends, with an error if need be."""
        try:
            reg = self.regions.get(region_id)
        except LookupError as exc:
            for i in range(len(blocks)):
                self.send((p.ENDED, restore_id, i, "bounds", str(exc)))
            return

        left = set(range(len(blocks)))
        reported: dict[int, set[int]] = {}

        def landed(i: int, group: int, err: DataError | None) -> None:
            reported.setdefault(i, set()).add(group)
            if not reg.closed:
                reg.add(reg.layout.get_done(blocks[i][2], group), success=int(err is None), error=int(err is not None))

        def ended(i: int, err: DataError | None) -> None:
            left.discard(i)
            self.send((p.ENDED, restore_id, i, err.kind if err else None, str(err) if err else ""))
        try:
            self.datapath.restore(reg.region, [(stored, runs) for stored, runs, _ in blocks], groups, landed, ended,
                                  reg.layout.kv_dtype if reg.layout is not None else "")
        except Exception as exc:  # noqa: BLE001 - a bug ends every block not ended yet on its counters
            logger.exception("restore %d failed", restore_id)
            for i in sorted(left):
                for group in set(range(len(groups))) - reported.get(i, set()):
                    landed(i, group, DataError("internal", str(exc)))
                ended(i, DataError("internal", str(exc)))

    def close(self) -> None:
        self.engine.stop()
        self.puts.close()
        self.nodes.close()
        self.datapath.close()
        self.regions.close()


def main(argv: list[str]) -> int:
    die_with_parent()
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m smartnic.fastpath FD (spawned by the SmartNIC agent)", file=sys.stderr)
        return 2
    # a fired block waits for the interpreter lock behind the PUT and I/O threads at most this long (5 ms
    # by default: a thread that wants the lock asks its holder to drop it only after the interval)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    conn = multiprocessing.connection.Connection(int(argv[0]))
    kind, settings = conn.recv()
    if kind != p.SETTINGS or not isinstance(settings, SmartNicSettings):
        print("smartnic.fastpath: the first message must be the settings", file=sys.stderr)
        return 2
    setup_logging("smartnic-fastpath", bool(os.environ.get("KVTB_LOG_JSON")))
    scale_settings.from_environment()  # the agent's hardware profile, if it runs under one
    own, inherited = set(placement.parse_cpus(settings.fastpath_cpus)), set(placement.current_cpus())
    if own and inherited - own:  # before any thread starts: the watcher alone on its own CPUs, the rest not
        placement.pin("smartnic-fastpath (PUT and I/O threads)", placement.format_cpus(inherited - own))
    return FastPathProcess(conn, settings).serve()
