"""The container benchmark's table from its records (no daemon needed)."""
from __future__ import annotations

from coldstart.bench.containers import render


def test_table_gives_medians_restored_counts_speed_up_and_the_warming_bound():
    rows = [{"size": "tiny", "method": "disk", "bw_bytes_s": 2**30, "gib_s": 1.0}]
    rows += [{"size": "tiny", "method": m, "cache": "warm", "rep": i, "first_token_s": t, **extra}
             for i, (m, t, extra) in enumerate([("naive", 60.0, {}), ("naive", 70.0, {}),
                                                 ("restore", 1.0, {"restored": True}),
                                                 ("restore", 3.0, {"restored": False, "fallback_reason": "x"})])]
    rows += [{"size": "tiny", "method": "restore", "cache": "cold", "rep": 0, "first_token_s": 4.0,
              "restored": True, "disk_read_bytes": 3 * 2**30},
             {"size": "tiny", "method": "restore+hostwarm", "cache": "cold", "rep": 0, "first_token_s": 3.3,
              "restored": True},
             {"size": "tiny", "method": "naive", "cache": "cold", "rep": 0, "error": "RuntimeError: boom"}]
    t = render(rows, "Host: test", "coldstart bench container")
    assert "| tiny | warm | 65.00 (2) | 2.00 (2) | - | 1/2 | **32.5x** |" in t
    assert "| tiny | cold | - (0) | 4.00 (1) | 3.30 (1) | 2/2 | - |" in t
    # bound = max(warm restore 2.0 s, 3 GiB / 1 GiB/s = 3.0 s) = 3.0 s; 3.3 / 3.0 = 1.10x; "*": the run's probe
    assert "| tiny | cold | 1.00* | 3.00 | 3.00 | 2.00 | 3.00 | 3.30 | **1.10x** | 4.00 |" in t
    assert "- tiny naive cold rep 0: RuntimeError: boom" in t
    assert "- tiny restore warm rep 3: x" in t


def test_the_warming_bound_takes_the_disk_probed_around_the_cold_starts_over_the_runs_one_probe():
    """The run's one probe fell in a slow minute (0.5 GiB/s); the probes around the cold starts say
    the disk read 1.5 and 2.5 GiB/s (means 1.5 and 2.5 -> median 2.0)."""
    rows = [{"size": "tiny", "method": "disk", "bw_bytes_s": 2**29, "gib_s": 0.5},
            {"size": "tiny", "method": "restore", "cache": "warm", "rep": 0, "first_token_s": 1.0, "restored": True},
            {"size": "tiny", "method": "restore", "cache": "cold", "rep": 0, "first_token_s": 3.0, "restored": True,
             "disk_read_bytes": 4 * 2**30, "disk_probe_bytes_s": [2**30, 2 * 2**30]},
            {"size": "tiny", "method": "restore+hostwarm", "cache": "cold", "rep": 0, "first_token_s": 2.4,
             "restored": True, "disk_read_bytes": 2 * 2**30, "disk_probe_bytes_s": [2 * 2**30, 3 * 2**30]}]
    t = render(rows, "Host: test", "coldstart bench container")
    # bound = max(1.0, 4 GiB / 2 GiB/s = 2.0 s) = 2.0 s; 2.4 / 2.0 = 1.20x (on the run's probe it would be 0.30x)
    assert "| tiny | cold | 2.00 | 4.00 | 2.00 | 1.00 | 2.00 | 2.40 | **1.20x** | 3.00 |" in t


def test_a_second_layout_of_a_model_shares_its_naive_starts():
    from coldstart.bench.containers import case_label

    assert case_label("bench", "dumped") == "bench" and case_label("bench", "hot") == "bench-hot"
    rows = [{"size": "bench", "model": "bench-seed0", "method": "naive", "cache": "warm", "rep": 0,
             "first_token_s": 100.0}]
    rows += [{"size": label, "model": "bench-seed0", "method": "restore", "cache": "warm", "rep": 0,
              "first_token_s": t, "restored": True} for label, t in (("bench", 2.0), ("bench-hot", 4.0))]
    t = render(rows, "Host: test", "coldstart bench container")
    assert "| bench | warm | 100.00 (1) | 2.00 (1) | - | 1/1 | **50.0x** |" in t
    assert "| bench-hot | warm | 100.00 (1) | 4.00 (1) | - | 1/1 | **25.0x** |" in t


def test_host_events_join_the_entrypoints_timeline_on_its_clock():
    from coldstart.containers.run import with_host_events

    summ = {"restored": True, "events": {"CONTAINER_START": 0.0, "ENTRYPOINT_START": 0.3, "FIRST_TOKEN": 1.2}}
    out = with_host_events(summ, 0.0123, 0.251)
    assert list(out["events"]) == ["CONTAINER_START", "CONTAINER_CREATE", "CONTAINER_STARTED", "ENTRYPOINT_START",
                                   "FIRST_TOKEN"]
    assert out["events"]["CONTAINER_CREATE"] == 0.0123 and out["restored"] is True
    assert with_host_events({}, None, 0.2) == {"events": {"CONTAINER_STARTED": 0.2}}


def test_the_warmings_own_cost_is_set_against_the_restore_with_host_warming():
    rows = [{"size": "bench", "method": m, "cache": c, "rep": 0, "first_token_s": t, "restored": True, **extra}
            for m, c, t, extra in [("restore", "warm", 2.0, {"disk_read_bytes": 0}),
                                   ("restore+load", "warm", 2.5, {"host_warm": {"bytes": 3 * 2**29}}),
                                   ("restore+hostwarm", "cold", 3.0, {})]]
    t = render(rows, "Host: test", "coldstart bench container")
    assert "| bench | 2.00 | 2.50 | 1.50 | 3.00 | **1.20x** |" in t


def test_the_decoy_is_a_whole_copy_made_once_and_evicted_alone(tmp_path):
    import os

    from coldstart.bench.containers import make_decoy
    from coldstart.warm.residency import evict_all, resident_bytes

    snap = tmp_path / "bench-hot"
    (snap / "criu" / "parent").mkdir(parents=True)
    (snap / "criu" / "parent" / "pages-1.img").write_bytes(b"p" * (1 << 20))
    (snap / "manifest.json").write_text("{}")
    os.mkfifo(snap / "fifo")  # the run dir's sockets and FIFOs are left out
    decoy = make_decoy(snap)
    assert decoy == tmp_path / "bench-hot.decoy" and not (decoy / "fifo").exists()
    assert (decoy / "criu" / "parent" / "pages-1.img").read_bytes() == b"p" * (1 << 20)
    (decoy / "marker").write_text("kept")
    assert make_decoy(snap) == decoy and (decoy / "marker").exists()  # made once
    evict_all([decoy])
    assert resident_bytes(decoy / "criu" / "parent" / "pages-1.img")[0] == 0
    assert resident_bytes(snap / "criu" / "parent" / "pages-1.img")[0] > 0


def test_the_entrypoints_cold_cost_is_added_to_the_bound_from_the_same_run():
    rows = [{"size": "tiny", "method": "disk", "bw_bytes_s": 2**30, "gib_s": 1.0}]
    rows += [{"size": "tiny", "method": m, "cache": c, "rep": 0, "restored": True, **x}
             for m, c, x in [("restore", "warm", {"first_token_s": 1.0}),
                             ("restore", "cold", {"first_token_s": 1.6, "disk_read_bytes": 2**29}),
                             ("restore+hostwarm", "cold", {"first_token_s": 1.3}),
                             ("entry", "warm", {"entry_s": 0.13}), ("entry", "cold", {"entry_s": 0.25}),
                             ("entry+hostwarm", "cold", {"entry_s": 0.27})]]
    t = render(rows, "Host: test", "coldstart bench container")
    # bound max(1.0, 0.5) = 1.0 -> 1.30x; the entry's cold cost min(0.25, 0.27) - 0.13 = 0.12:
    # bound with it max(1.0 + 0.12, 0.5) = 1.12 -> 1.3 / 1.12 = 1.16x
    assert "| tiny | 0.130 | 0.250 | 0.270 | 0.120 | 1.00 | 1.12 | 1.30 | **1.16x** |" in t
    assert "**1.30x**" in t


def test_the_table_says_at_which_milestone_the_cold_start_falls_behind():
    def start(method: str, cache: str, shift: float, late: float) -> dict:
        ev = {"CONTAINER_STARTED": 0.2 + shift, "ENTRY_PYTHON": 0.21 + shift, "ENTRY_READY": 0.3 + shift,
              "RESTORE_DONE": 0.5 + shift + late, "FIRST_TOKEN": 0.7 + shift + late}
        return {"size": "tiny", "method": method, "cache": cache, "rep": 0, "first_token_s": 0.8, "events": ev}

    rows = [start("restore", "warm", 0.0, 0.0), start("restore+hostwarm", "cold", 0.15, 0.05)]
    t = render(rows, "Host: test", "coldstart bench container")
    assert "| tiny | warm | 0.200 | 0.210 | 0.300 | 0.500 | - | 0.700 |" in t
    assert "| tiny | **lost** | +0.150 | +0.150 | +0.150 | +0.200 | - | +0.200 |" in t
    assert "Where the cold" not in render(rows[:1], "Host: test", "coldstart bench container")  # no cold starts


def test_a_node_with_only_the_snapshot_cold_is_held_to_its_own_bound():
    rows = [{"size": "tiny", "method": "disk", "bw_bytes_s": 2**30, "gib_s": 1.0}]
    ev = lambda shift: {"CONTAINER_STARTED": 0.2 + shift, "FIRST_TOKEN": 0.7 + shift}  # noqa: E731
    rows += [{"size": "tiny", "method": m, "cache": c, "rep": 0, "restored": True, "events": ev(x["first_token_s"] - 1.0),
              "disk_probe_bytes_s": [2**30, 2**30], **x}
             for m, c, x in [("restore", "warm", {"first_token_s": 1.0}),
                             ("restore", "cold", {"first_token_s": 1.6, "disk_read_bytes": 2**29}),
                             ("restore+hostwarm", "cold", {"first_token_s": 1.3}),
                             ("restore", "cold-snapshot", {"first_token_s": 1.4, "disk_read_bytes": 2**28}),
                             ("restore+hostwarm", "cold-snapshot", {"first_token_s": 1.1, "disk_read_bytes": 2**27})]]
    t = render(rows, "Host: test", "coldstart bench container")
    assert "| tiny | cold-snapshot | - (0) | 1.40 (1) | 1.10 (1) | 2/2 | - |" in t
    # the cold-snapshot restore alone read 0.25 GiB: bound max(1.0, 0.25) = 1.0 -> 1.10x
    assert "| tiny | cold | 1.00 | 0.50 | 0.50 | 1.00 | 1.00 | 1.30 | **1.30x** | 1.60 |" in t
    assert "| tiny | cold-snapshot | 1.00 | 0.25 | 0.25 | 1.00 | 1.00 | 1.10 | **1.10x** | 1.40 |" in t
    assert "| tiny | restore+hostwarm (cold-snapshot) | 1.00 (1.00-1.00) | 0.12 | 1.00 | 1.10 | **1.10x** |" in t
    assert "| tiny | **lost** (cold-snapshot) | +0.100 |" in t


def test_an_unknown_cache_state_or_method_is_refused_before_any_work():
    from typer.testing import CliRunner

    from coldstart.cli import app

    for opt, bad in (("--caches", "warm,bogus"), ("--methods", "restore,nope")):
        r = CliRunner().invoke(app, ["bench", "container", opt, bad, "--host", "unix:///nonexistent.sock"],
                               env={"COLUMNS": "200"})
        assert r.exit_code == 2
        assert f"Invalid value for {opt}" in r.output and "choose from" in r.output
