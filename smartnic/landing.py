"""A stored block's value landing in a region, range by range, checked layer group by layer group.

A layer-wise restore reads each block's value (fabric.chunk_format v4: header | token ids | MACs |
KV parts) in one byte range per layer group: group 0's range is the head (header, token ids, every
MAC) and the KV parts of the group's layers; each later group's range is its layers' parts. The
bytes are copied into the region as they arrive and hashed while still in the CPU's cache
(hostmem.dma: with its compiled engine, one C call a piece copies a block's KV and feeds each part's
MAC without the GIL, hostmem/_lander.c; with numpy, Python does it part by part); a group counts as
landed only once the head checked out (the header names the block asked for, in the generation the
requester knows; the head's MAC covers header and token ids) and each of its parts matches its MAC.
A GET of a whole value is the case of one group and one range.

Pure: numpy and the copy engine only (no zmq or grpc); the data path feeds it.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from fabric import chunk_format as cf
from hostmem import dma, gather
from kvtb import crc32c as _crc
from smartnic.requester import StoredBlock

logger = logging.getLogger(__name__)


class DataError(Exception):
    """A failed PUT or GET; kind is what the statistics and ReadErrors report."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


OnGroup = Callable[[int, "DataError | None"], None]


class Landing:
    """One block's value arriving as byte ranges (one per layer group), placed into `targets` of `mem`.

    groups: [first, end) KV parts of each layer group (a block: its layers), or None for a whole
    value read as one range (its parts whatever its header says). on_group(group, error) reports
    each group exactly once, success only when the head and the group's parts check out, and only
    when nothing more will be written to the group's bytes: a range that arrived whole, or a
    block that failed (after its first failure a block writes nothing more, and every group not
    reported yet reports that failure). on_end(error) follows the last report, with the first
    failure (None: every group landed). Pieces of one range must come in order.
    Thread-safe: the data path's threads may feed and end ranges; a lock serialises them.
    """

    def __init__(self, chunk: StoredBlock, mem, targets: Sequence[gather.Run], mac_key: bytes | None,
                 groups: Sequence[tuple[int, int]] | None, on_group: OnGroup,
                 on_end: Callable[[DataError | None], None] = lambda error: None, kv_dtype: str = "",
                 engine: str | None = None):
        self.chunk, self.mem, self.targets, self.mac_key = chunk, mem, targets, mac_key
        self.engine = engine  # hostmem.dma's: "compiled" lands KV in C (None: its default)
        self.lander = None    # the compiled landing, made at the first KV byte
        self.kv_dtype = kv_dtype  # the pool's element type: a header of another fails the block ("": any)
        self.on_group, self.on_end = on_group, on_end
        self.whole = groups is None
        self.groups = [(0, 0)] if groups is None else list(groups)
        n = len(self.groups)
        self.received = [0] * n
        self.arrived = [False] * n
        self.reported = [False] * n
        self.error: DataError | None = None
        self.head_ok = False
        self.layout: cf.ValueLayout | None = None
        self.crc: int | None = 0 if self.whole and mac_key is None else None  # a whole value without MACs
        self.macs = bytearray()
        self.hashers: dict[int, object] = {}
        self._lock = threading.Lock()
        self.ids_bytes = chunk.token_count * cf.TOKEN_ID_BYTES
        self.kv_bytes = sum(r.nbytes for r in targets) - self.ids_bytes
        if not self.whole:
            self.layout = self._expected()

    # -- where the ranges lie
    def _expected(self) -> cf.ValueLayout | None:
        """The layout the requester's record implies (None: it cannot be right; the block then fails)."""
        parts = self.groups[-1][1]
        mac = cf.MAC_BYTES if self.mac_key else 0
        layout = cf.ValueLayout(self.chunk.header_bytes, self.ids_bytes, mac, parts, self.kv_bytes)
        if not self.chunk.header_bytes or layout.length != self.chunk.length or self.kv_bytes % parts:
            return None
        return layout

    def range(self, group: int) -> tuple[int, int]:
        """(offset, length) of a group's range in the value: group 0's starts with the head."""
        if self.whole:
            return 0, self.chunk.length
        first, end = self.groups[group]
        offset, length = self.layout.parts_range(first, end)
        return (0, offset + length) if group == 0 else (offset, length)

    @property
    def usable(self) -> bool:
        """Whether its ranges can be asked for (False: the record cannot describe the stored value)."""
        return self.layout is not None or self.whole

    @property
    def placed_bytes(self) -> int:
        """Token id and KV bytes a whole landing puts into the region."""
        return self.ids_bytes + self.kv_bytes

    # -- pieces in, reports out
    def take(self, group: int, offset: int, frames: Sequence) -> None:
        """Place the piece of `group`'s range that starts at `offset` in the value (frames in order)."""
        with self._lock:
            if self.error is not None or self.reported[group]:
                return
            try:
                self._take(group, offset, frames)
            except DataError as exc:
                self._fail(exc)
            except Exception as exc:  # a bug must end on the counter, not in a log
                logger.exception("GET of chunk %d: placing a piece failed", self.chunk.chunk_index)
                self._fail(DataError("internal", f"scatter failed: {exc}"))

    def end_range(self, group: int, error: DataError | None = None) -> None:
        """The command that read `group`'s range ended (with `error`, or having sent all it will)."""
        with self._lock:
            if self.error is not None or self.reported[group]:
                return
            if error is None and not self.arrived[group]:
                start, length = self.range(group) if self.usable else (0, 0)
                error = DataError("length_mismatch", f"chunk {self.chunk.chunk_index}: {self.received[group]} "
                                                     f"bytes of a range of {length} from {start} came")
            if error is not None:
                self._fail(error)

    def fail(self, error: DataError) -> None:
        """Fail the block now (nothing more is written; every group not reported yet reports `error`)."""
        with self._lock:
            if self.error is None:
                self._fail(error)

    def _fail(self, error: DataError) -> None:
        self.error = error
        for group in range(len(self.groups)):
            self._report(group, error)

    def _report(self, group: int, error: DataError | None) -> None:
        if self.reported[group]:
            return
        self.reported[group] = True
        try:
            self.on_group(group, error)
        except Exception:
            logger.exception("GET completion handler failed")
        if all(self.reported):
            try:
                self.on_end(self.error)
            except Exception:
                logger.exception("GET end handler failed")

    def _take(self, group: int, offset: int, frames: Sequence) -> None:
        index = self.chunk.chunk_index
        size = sum(memoryview(f).nbytes for f in frames)
        start, length = self.range(group)
        if offset != start + self.received[group] or self.received[group] + size > length:
            raise DataError("length_mismatch", f"chunk {index}: bytes [{offset}, {offset + size}) after "
                                               f"{self.received[group]} of a range of {length} from {start}")
        pos = offset
        if group == 0 and self.received[0] == 0:  # the range starts with the header
            pos += self._header(frames)
        for view in cf.skip(frames, pos - offset):
            self._place(pos, view)
            pos += view.nbytes
        self.received[group] += size
        if self.received[group] == length:
            self.arrived[group] = True
            self._check(group)

    def _header(self, frames: Sequence) -> int:
        header, head = check_header(frames, self.chunk, self.mac_key is not None)
        if self.kv_dtype and header.kv_dtype != self.kv_dtype:  # never read KV as another type
            raise DataError("dtype_mismatch", f"chunk {self.chunk.chunk_index} holds {header.kv_dtype} KV, the "
                                              f"pool {self.kv_dtype}")
        layout = cf.value_layout(header, len(head))
        if self.whole:
            if header.token_ids_bytes + header.kv_bytes != self.ids_bytes + self.kv_bytes:
                raise DataError("length_mismatch", f"chunk {self.chunk.chunk_index} does not fit its ranges")
            self.layout, self.groups = layout, [(0, header.kv_parts)]
        elif layout != self.layout:
            raise DataError("bad_header", f"chunk {self.chunk.chunk_index} is laid out as {layout}, expected "
                                          f"{self.layout} (another pool layout)")
        self.macs = bytearray(layout.macs_bytes)
        if self.mac_key is not None:
            self.hashers[cf.HEAD] = cf.chunk_mac(self.mac_key, self.chunk.key, header.generation)
            self.hashers[cf.HEAD].update(head)
        if self.crc is not None:
            self.crc = _crc.extend(self.crc, head)
        return len(head)

    def _place(self, pos: int, view: memoryview) -> None:
        """Copy bytes of the value at `pos` to where they go: token ids and KV into the region (hashed right
        after the copy, while still in cache), the MACs aside."""
        L = self.layout
        while view.nbytes:
            if pos < L.macs_offset:
                n = min(view.nbytes, L.macs_offset - pos)
                self._copy(view[:n], pos - L.ids_offset, [(cf.HEAD, 0, n)])
            elif pos < L.kv_offset:
                n = min(view.nbytes, L.kv_offset - pos)
                self.macs[pos - L.macs_offset:pos - L.macs_offset + n] = view[:n]
                if self.crc is not None:
                    self.crc = _crc.extend(self.crc, view[:n])
            elif self._compiled():  # the rest of the piece is KV: one C call copies it and feeds the parts' MACs
                n = view.nbytes
                self.lander.place(view, self.mem, pos - L.kv_offset)
            else:  # one copy for up to a MAC block of KV, then each part's bytes of it into that part's MAC
                n, spans, at = min(view.nbytes, dma.MAC_BLOCK_BYTES), [], pos
                while at < pos + n:
                    part = L.part_of(at)
                    end = min(pos + n, L.kv_offset + (part + 1) * L.part_bytes)
                    spans.append((part, at - pos, end - pos))
                    at = end
                self._copy(view[:n], self.ids_bytes + pos - L.kv_offset, spans)
            view, pos = view[n:], pos + n

    def _compiled(self) -> bool:
        """Whether KV lands through the compiled lander (made at the first KV byte: MACs on, engine built)."""
        if self.lander is None and self.mac_key is not None and self.engine != "numpy":
            L = self.layout
            self.lander = dma.lander(self.targets, self.ids_bytes, L.part_bytes, L.kv_parts, self.mac_key,
                                     cf.mac_prefix(self.chunk.key, self.chunk.generation), self.engine)
            if self.lander is None:
                self.engine = "numpy"  # not built: Python from now on
        return self.lander is not None

    def _copy(self, piece: memoryview, target_offset: int, spans: list[tuple[int, int, int]]) -> None:
        """Copy `piece` into the targets from target_offset on; feed each (part, start, end) span of it to
        that part's MAC (or the crc32c of a whole value without MACs)."""
        _, crc = dma.scatter(piece, self.mem, gather.cut(self.targets, target_offset, piece.nbytes), self.crc)
        if self.crc is not None:
            self.crc = crc
        if self.mac_key is None:
            return
        for part, start, end in spans:
            mac = self.hashers.get(part)
            if mac is None:
                mac = self.hashers[part] = cf.chunk_mac(self.mac_key, self.chunk.key, self.chunk.generation, part)
            mac.update(piece[start:end])

    def _check(self, group: int) -> None:
        """A range arrived whole: check the head (group 0's) and every group waiting for it."""
        if group == 0:
            if self.mac_key is not None and not cf.same_mac(self.hashers[cf.HEAD].digest(cf.MAC_BYTES),
                                                            self.layout.mac(self.macs, cf.HEAD)):
                raise DataError("mac_mismatch", f"chunk {self.chunk.chunk_index}: the MAC of its header and token "
                                                f"ids does not match (forged, moved or damaged)")
            self.head_ok = True
        if not self.head_ok:
            return  # its parts are checked once the head is
        for g in range(len(self.groups)):
            if self.arrived[g] and not self.reported[g]:
                self._check_parts(g)
                self._report(g, None)

    def _check_parts(self, group: int) -> None:
        first, end = self.groups[group]
        if self.mac_key is None:
            if self.crc is not None and self.crc != self.chunk.crc32c:  # a whole value without MACs
                raise DataError("crc_mismatch", f"chunk {self.chunk.chunk_index}: crc32c mismatch on arrival")
            return
        if self.lander is not None:
            bad = self.lander.check(first, end, self.macs, self.layout.mac_bytes)  # part 0's MAC follows the head's
            if bad >= 0:
                raise DataError("mac_mismatch", f"chunk {self.chunk.chunk_index}: the MAC of KV part {bad} does "
                                                f"not match (forged, moved or damaged)")
            return
        for part in range(first, end):
            hasher = self.hashers.get(part) or cf.chunk_mac(self.mac_key, self.chunk.key, self.chunk.generation, part)
            if not cf.same_mac(hasher.digest(cf.MAC_BYTES), self.layout.mac(self.macs, part)):
                raise DataError("mac_mismatch", f"chunk {self.chunk.chunk_index}: the MAC of KV part {part} does "
                                                f"not match (forged, moved or damaged)")


def check_header(frames, chunk: StoredBlock, mac: bool) -> tuple[cf.ChunkHeader, bytes]:
    """(header, its bytes), once the header names the block asked for (its name, owner and place in the
    chain), in the generation the requester knows, carries MACs when they are checked, and has the
    value's length."""
    try:
        leading = cf.leading_bytes(frames, cf.MAX_HEADER_BYTES)
        header, header_len = cf.decode_header(leading)
    except cf.ChunkFormatError as exc:
        raise DataError("bad_header", str(exc)) from exc
    got = (header.name, header.chunk_index, header.num_tokens, header.tenant, header.user_id, header.shared)
    want = (chunk.hash, chunk.chunk_index, chunk.token_count, chunk.tenant, chunk.user_id, chunk.shared)
    if got != want:
        raise DataError("bad_header", f"chunk header names {got[1:]}, expected {want[1:]} (another block)")
    if mac and header.mac_bytes != cf.MAC_BYTES:
        raise DataError("mac_mismatch", f"chunk {chunk.chunk_index} carries no MAC: unauthenticated")
    if header.generation > chunk.generation:  # rewritten since (another replica stored the same name again)
        raise DataError("newer_generation", f"chunk {chunk.chunk_index} is generation {header.generation}, "
                                            f"newer than the {chunk.generation} expected (stored again)")
    if header.generation != chunk.generation:
        raise DataError("stale_generation", f"chunk {chunk.chunk_index} is generation {header.generation}, "
                                            f"expected {chunk.generation} (an older copy)")
    if cf.value_length(header, header_len) != chunk.length:
        raise DataError("length_mismatch", f"chunk {chunk.chunk_index} is not as long as its record says")
    return header, leading[:header_len]
