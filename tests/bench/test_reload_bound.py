"""`bench reload`'s bound line: each cold default reload against its own round's device probe, and
against max(the file at that speed, the host's busy CPU-seconds over the cores)."""
from __future__ import annotations

import os

from coldstart.bench.pipeline import _reload_bound


def test_the_bound_names_the_cpu_where_the_step_needed_more_cpu_than_disk_time() -> None:
    cores = os.cpu_count() or 1
    gib = 1 << 30
    rows = [  # round 0: the disk reads the GiB in 0.5 s, the step used 1.6 s x cores of CPU
        {"cache": "cold", "method": "auto", "rep": 0, "bytes": gib, "seconds": 1.0, "wall_seconds": 1.0,
         "host_cpu_busy_s": 0.8 * cores},
        # round 1: the disk is the larger (1 s), the step took 1.25 s
        {"cache": "cold", "method": "auto", "rep": 1, "bytes": gib, "seconds": 1.25, "wall_seconds": 1.25,
         "host_cpu_busy_s": 0.1 * cores},
        {"cache": "warm", "method": "auto", "rep": 0, "bytes": gib, "seconds": 0.1, "host_cpu_busy_s": 1.0},
    ]
    text = " ".join(_reload_bound(rows, {0: 2.0, 1: 1.0}))
    assert "(each: 0.50, 0.80)" in text  # against the device alone
    assert "(each: 0.80, 0.80)" in text and "larger in 1 of 2 rounds" in text
    assert _reload_bound(rows, {}) == []  # no device probe: no line


def test_each_round_is_paired_with_the_mean_of_the_probes_around_it() -> None:
    from coldstart.bench.pipeline import reload_table

    gib = 1 << 30

    def step(method, cache, rep, seconds):
        return {"bench": "reload", "method": method, "cache": cache, "rep": rep, "bytes": gib, "seconds": seconds,
                "wall_seconds": seconds, "canary_s": 0.5, "canary_ok": True, "resident_before": 0.0 if cache == "cold" else 1.0,
                "detail": {"mode": "map"}}

    def dev(rep, when, gib_s):
        row = {"method": "device", "cache": "cold", "rep": rep, "bytes": gib, "seconds": 1 / gib_s}
        return {**row, "when": when} if when else row

    rows = [step("stock", "warm", 0, 2.0), step("auto", "warm", 0, 0.5), dev(0, "before", 2.0),
            step("stock", "cold", 0, 3.0), step("auto", "cold", 0, 1.0), dev(0, "after", 1.0)]
    text = "\n".join(reload_table(rows, "bench", ("stock", "auto")))
    assert "the mean of the two" in text and "median 1.50 GiB/s" in text  # (2.0 + 1.0) / 2
    assert "in its round: median 0.67×" in text  # 1 GiB at 1.5 GiB/s = 0.67 s, against 1.0 s
    old = [r for r in rows if r.get("when") != "after"]  # runs before the probe after: one per round
    for r in old:
        r.pop("when", None)
    assert "once per round" in "\n".join(reload_table(old, "bench", ("stock", "auto")))


def test_the_floor_is_the_warm_reload_or_the_disk_and_the_serial_map_times_its_read_alone() -> None:
    gib = 1 << 30
    rows = [  # the device reads the GiB in 0.5 s; the warm reload (the same packing) takes 0.8 s
        {"cache": "warm", "method": "auto", "rep": 0, "bytes": gib, "seconds": 0.8},
        {"cache": "cold", "method": "auto", "rep": 0, "bytes": gib, "seconds": 1.0, "wall_seconds": 1.0},
        # the serial map: 1.2 s in all, of which 0.7 s packing after a 0.5 s read
        {"cache": "cold", "method": "map-serial", "rep": 0, "bytes": gib, "seconds": 1.2,
         "detail": {"prepack_s": 0.7}},
    ]
    text = " ".join(_reload_bound(rows, {0: 2.0}))
    assert "at best 0.800 s, 0.62× the device" in text and "1.25× that floor" in text
    assert "The read alone" in text and "median 1.00×" in text


def test_the_table_says_how_the_device_was_probed_to_read_cold_copies() -> None:
    from coldstart.bench.pipeline import reload_table

    gib = 1 << 30
    step = {"bench": "reload", "cache": "cold", "rep": 0, "bytes": gib, "seconds": 1.0, "wall_seconds": 1.0,
            "canary_s": 0.5, "canary_ok": True, "resident_before": 0.0, "detail": {"mode": "copy"}}
    shape = {"bench": "reload", "method": "read-shape", "cache": "cold", "rep": -1, "seconds": 0.0, "bytes": 0,
             "detail": {"device": "252:0 (vda)", "direct_gib_s": [0.81, 0.9], "buffered_gib_s": [1.7, 1.5],
                        "direct": False, "span_bytes": 128 << 20}}
    text = "\n".join(reload_table([{**step, "method": "stock"}, {**step, "method": "auto"}, shape],
                                  "bench", ("stock", "auto")))
    assert ("device 252:0 (vda) probed before the first round" in text and "first 128 MiB" in text
            and "O_DIRECT 0.81, 0.90 GiB/s, buffered 1.70, 1.50 GiB/s -> buffered" in text), text


def test_the_page_cache_line_pairs_each_cold_reload_with_its_rounds_fastest_buffered_probe() -> None:
    """A map reads through the page cache: the table states that path's rate (fio's fastest buffered
    shape) beside O_DIRECT's, and the default cold reload against the first, per round."""
    gib = 1 << 30

    def dev(rep, when, fio, gib_s):
        return {"method": "device", "cache": "cold", "rep": rep, "when": when, "bytes": gib, "seconds": 1 / gib_s,
                "detail": {"fio": fio}}

    rows = [{"cache": "cold", "method": "auto", "rep": 0, "bytes": gib, "seconds": 1.0, "wall_seconds": 1.0},
            dev(0, "before", "buffered, 4 jobs, 1 MiB reads", 1.0), dev(0, "before", "buffered, 4 jobs, 16 MiB reads", 1.2),
            dev(0, "before", "O_DIRECT, 4 jobs, 1 MiB reads", 1.5), dev(0, "after", "buffered, 4 jobs, 1 MiB reads", 0.8),
            dev(0, "after", "O_DIRECT, 4 jobs, 1 MiB reads", 1.3)]
    text = " ".join(_reload_bound(rows, {0: 1.4}))
    # buffered: (1.2 + 0.8) / 2 = 1.0 GiB/s; O_DIRECT: (1.5 + 1.3) / 2 = 1.4; the reload read 1 GiB/s
    assert "fastest buffered shape in the same rounds, median 1.00 GiB/s" in text
    assert "fastest O_DIRECT shape 1.40 GiB/s" in text and "O_DIRECT / buffered per round: median 1.40" in text
    assert "against the page cache's rate in its round: median 1.00× (each: 1.00)" in text


def test_one_read_shape_as_bench_load_takes_its_limit_is_stated_beside_the_rounds_fastest() -> None:
    """Each round's fastest of several noisy shapes sits above any one shape: the table also pairs the
    reload with the single shape of the fastest median over the run (bench load's limit)."""
    gib = 1 << 30

    def dev(rep, fio, gib_s):
        return {"method": "device", "cache": "cold", "rep": rep, "when": "before", "bytes": gib, "seconds": 1 / gib_s,
                "detail": {"fio": fio}}

    a, b = "O_DIRECT, 4 jobs, 1 MiB reads", "buffered, 4 jobs, 1 MiB reads"
    rows = [{"cache": "cold", "method": "auto", "rep": rep, "bytes": gib, "seconds": 1.0, "wall_seconds": 1.0}
            for rep in (0, 1, 2)]
    # a: 1.0, 1.0, 2.0 (median 1.0); b: 1.25, 1.25, 1.0 (median 1.25): each round's fastest is 1.25, 1.25, 2.0
    rows += [dev(0, a, 1.0), dev(1, a, 1.0), dev(2, a, 2.0), dev(0, b, 1.25), dev(1, b, 1.25), dev(2, b, 1.0)]
    text = " ".join(_reload_bound(rows, {0: 1.25, 1: 1.25, 2: 2.0}))
    assert f"fastest median over the run: {b}, 1.25 GiB/s" in text, text
    assert "paired per round, median 0.80× (each: 0.80, 0.80, 1.00)" in text, text
    assert "that shape itself read at 1.00× of it (median)" in text, text


def test_the_into_memory_probe_pairs_each_cold_reload_with_the_mean_of_its_rounds_reads() -> None:
    """A reload lands every byte in a page of its own; fio reuses one small buffer per job. The table
    pairs the default cold reload with the device read into memory the file's size, in its round."""
    gib = 1 << 30

    def mem(rep, when, gib_s):
        return {"method": "device-memory", "cache": "cold", "rep": rep, "when": when, "bytes": gib,
                "seconds": 1 / gib_s, "detail": {"read": "O_DIRECT into memory"}}

    rows = [{"cache": "cold", "method": "auto", "rep": rep, "bytes": gib, "seconds": 1.0, "wall_seconds": 1.0}
            for rep in (0, 1)]
    rows += [mem(0, "before", 1.2), mem(0, "after", 0.8), mem(1, "before", 1.25)]
    text = " ".join(_reload_bound(rows, {0: 2.0, 1: 1.25}))
    # round 0: (1.2 + 0.8) / 2 = 1.0 GiB/s, half the device; round 1: 1.25, the device itself
    assert "paired per round, median 0.90× (each: 1.00, 0.80)" in text, text
    assert "at 0.75× the device limit (each: 0.50, 1.00)" in text, text
    assert "device-memory" not in text


def test_the_into_memory_reader_reads_the_files_bytes_each_into_its_own_place(tmp_path) -> None:
    """DirectIntoMemory reads the file's head (whole blocks per thread) with O_DIRECT into its buffer,
    each block where it lies in the file; a file shorter than one block per thread is one clear error."""
    import pytest

    from coldstart.bench.weights import DirectIntoMemory
    from coldstart.errors import ColdstartError

    data = os.urandom(4 << 20) + b"tail"
    path = tmp_path / "w.flat"
    path.write_bytes(data)
    reader = DirectIntoMemory(path, block=256 << 10, threads=4)
    try:
        nbytes, secs = reader.run()
    except ColdstartError as e:  # a file system without O_DIRECT (tmpfs): nothing of this reader to test there
        pytest.skip(f"O_DIRECT unsupported under {tmp_path}: {e}")
    assert nbytes == 4 << 20 and secs > 0
    assert bytes(reader._buf) == data[:4 << 20]
    (tmp_path / "small").write_bytes(b"x" * 1000)
    with pytest.raises(ColdstartError, match="too small"):
        DirectIntoMemory(tmp_path / "small", block=1 << 20, threads=4)
