"""The pure parts of `kvtb bench smartnic` (its runs are in test_smoke.py): chunk layout, tables."""
import pytest

from bench.smartnic import (
    SECURITY_FLOORS,
    rounds_line,
    security_line,
    security_ratios,
    strided_ranges,
    transfers_table,
)


def test_the_chunks_rows_tile_the_area_exactly_once():
    count, chunk, rows, base = 4, 64, 8, 1000
    covered = sorted(r for i in range(count) for r in strided_ranges(base, i, count, chunk, rows))
    assert covered == [(base + j * (chunk // rows), chunk // rows) for j in range(count * rows)]
    assert strided_ranges(base, 1, count, chunk, rows)[:2] == ((base + 8, 8), (base + 40, 8))


def test_a_chunk_must_split_into_whole_rows():
    with pytest.raises(ValueError, match="equal rows"):
        strided_ranges(0, 0, 2, 65, 8)


TRANSFER = {"chunk_bytes": 1 << 20, "put_bytes_per_s": 600e6, "get_bytes_per_s": 400e6,
            "storage_node_direct": {"put_bytes_per_s": 900e6, "get_bytes_per_s": 800e6},
            "put_limit_bytes_per_s": 1000e6, "get_limit_bytes_per_s": 2000e6, "put_vs_limit": 0.6,
            "get_vs_limit": 0.2, "rounds_bytes_per_s": {"put": [3e9, 1e9, 2e9], "get": [4e9, 5e9, 6e9, 7e9]}}


def test_rounds_line_gives_worst_median_and_best_of_each_op():
    assert rounds_line(TRANSFER) == ("1 MiB rounds, MB/s worst / median / best: PUT 1000 / 2000 / 3000, "
                                     "GET 4000 / 5500 / 7000")


def test_the_transfers_table_puts_path_node_and_limit_side_by_side():
    head, _, row, spread = transfers_table([TRANSFER]).splitlines()
    assert head.split()[:4] == ["chunk", "PUT", "MB/s", "node"]
    assert row.split() == ["1", "MiB", "600", "900", "1000", "0.60", "400", "800", "2000", "0.20"]
    assert spread == rounds_line(TRANSFER)


def with_security(t: dict, open_put: float, open_get: float, curve_put: float, curve_get: float) -> dict:
    out = {**t, "security": {"open": {"put_bytes_per_s": open_put, "get_bytes_per_s": open_get},
                             "curve": {"put_bytes_per_s": curve_put, "get_bytes_per_s": curve_get}}}
    for mode, f in (("secure", t), ("curve", out["security"]["curve"])):
        for op, base in (("put", open_put), ("get", open_get)):
            out[f"{op}_{mode}_vs_open"] = f[f"{op}_bytes_per_s"] / base
    return out


def test_security_ratios_compare_each_mode_with_open_and_name_16_mib_plainly():
    small = with_security(TRANSFER, 800e6, 500e6, 300e6, 100e6)
    large = with_security({**TRANSFER, "chunk_bytes": 16 << 20}, 600e6, 800e6, 150e6, 200e6)
    ratios = security_ratios([small, large])
    assert ratios["put_secure_vs_open_1mb"] == 0.75 and ratios["get_secure_vs_open_1mb"] == 0.8
    assert ratios["put_secure_vs_open"] == 1.0 and ratios["get_secure_vs_open"] == 0.5
    assert ratios["get_curve_vs_open"] == 0.25 and "put_curve_vs_open_16mb" in ratios
    assert set(SECURITY_FLOORS) == {"put_secure_vs_open", "get_secure_vs_open"}


def test_the_security_line_gives_every_mode_beside_open():
    line = security_line(with_security(TRANSFER, 800e6, 500e6, 300e6, 100e6))
    assert line == ("1 MiB by security, MB/s (vs open): PUT secure 600 (0.75), open 800, curve 300 (0.38); "
                    "GET secure 400 (0.80), open 500, curve 100 (0.20)")
    assert transfers_table([with_security(TRANSFER, 800e6, 500e6, 300e6, 100e6)]).splitlines()[-1] == line


def test_chunks_are_stored_with_a_mac_per_layer_of_the_real_model():
    from bench import smartnic
    from fabric import chunk_format as cf
    assert smartnic.KV_PARTS == 30  # SmolLM2-135M's layers: the product MACs a block per layer
    assert smartnic.chunk_format_settings() == {"chunk_format_version": cf.VERSION, "kv_parts": 30,
                                                "ranges_per_chunk": smartnic.RANGES_PER_CHUNK}
    for nominal in (64 << 10, 1 << 20, 16 << 20, 64 << 20):
        kv = smartnic.kv_bytes_of(nominal)
        assert nominal - 1920 < kv <= nominal and kv % 30 == 0 and kv % smartnic.RANGES_PER_CHUNK == 0
    with pytest.raises(ValueError):
        smartnic.kv_bytes_of(1000)


def test_the_benchmarks_agents_put_plain_chunks_in_kv_parts():
    from bench.smartnic import LayerParts

    class Datapath:
        def __init__(self):
            self.puts, self.nsid = [], 1

        def put(self, region, header, key, runs, done, kv_parts=1):
            self.puts.append(kv_parts)

    inner = Datapath()
    wrapped = LayerParts(inner)
    wrapped.put("region", "header", b"key", [], None)          # the agent's plain chunk: no kv_parts
    wrapped.put("region", "header", b"key", [], None, kv_parts=30)  # a standing PUT's block
    assert inner.puts == [30, 30] and wrapped.nsid == 1


def test_a_failed_size_is_recorded_and_the_others_still_run(monkeypatch):
    from bench import smartnic
    from bench.progress import Progress

    def transfer(agents, size, *args):
        if size == 1 << 20:
            raise RuntimeError("3 transfers of 1 MiB chunks failed in round 1")
        return {**TRANSFER, "chunk_bytes": size}
    monkeypatch.setattr(smartnic, "transfer_beside_limits", transfer)
    result = {"bench": "datapath", "failed": []}
    rows = smartnic.transfers_by_size(result, {}, [64 << 10, 1 << 20, 16 << 20], 1, 1, 0.1, None,
                                      Progress(3, "x", enabled=False))
    assert [t["chunk_bytes"] for t in rows] == [64 << 10, 16 << 20]
    assert result["failed"] == [{"part": "1 MiB chunks",
                                 "error": "RuntimeError: 3 transfers of 1 MiB chunks failed in round 1"}]


@pytest.mark.service  # the report's machine record asks git for the commit
def test_each_placement_runs_with_and_without_the_fire_ring_and_they_are_compared(monkeypatch, tmp_path):
    import contextlib

    from bench import smartnic

    measured = []

    def placement(args, directory, name, ring=False):
        measured.append((name, ring))
        p50 = 50.0 if ring else 100.0
        scene = {"p50_us": p50, "p99_us": 400.0, "samples": 10}
        return {"layout": {"compute": "0"}, "settings": {"watcher_fire_ring": ring},
                "trigger_to_fire": {"idle": scene, "load": scene}, "context_restore": {"vs_zmq": 0.5}}

    @contextlib.contextmanager
    def no_agents(*args, **kwargs):
        yield {}

    monkeypatch.setattr(smartnic, "measure_placement", placement)
    monkeypatch.setattr(smartnic, "agents_beside_storage", no_agents)
    monkeypatch.setattr(smartnic, "transfers_by_size", lambda *a: [])
    args = smartnic.parse_args(["--placements", "shared", "nic", "--fire-ring", "off", "on", "--out", str(tmp_path),
                                "--sizes-mib", "1"])
    result = smartnic.run(args)
    assert measured == [("shared", False), ("shared", True), ("nic", False), ("nic", True)]
    assert list(result["results"]["by_placement"]) == ["shared", "shared+ring", "nic", "nic+ring"]
    assert result["ratios"]["trigger_to_fire_idle_p50_us@nic_ring_vs_off"] == 0.5
    assert result["ratios"]["trigger_to_fire_load_p99_us@shared_ring_vs_off"] == 1.0
    assert result["results"]["trigger_to_fire"]["idle"]["p50_us"] == 100.0  # shared, without the ring
    assert "trigger_to_fire_idle_p50_us@nic+ring" in result["floors"]  # the NIC targets apply to it
