"""The container benchmark's table from its records (no daemon needed)."""
from __future__ import annotations

from coldstart.containers.bench import render


def test_table_gives_medians_restored_counts_and_speed_up():
    rows = [{"size": "tiny", "method": m, "cache": "warm", "rep": i, "first_token_s": t, **extra}
            for i, (m, t, extra) in enumerate([("naive", 60.0, {}), ("naive", 70.0, {}),
                                                ("restore", 1.0, {"restored": True}),
                                                ("restore", 3.0, {"restored": False, "fallback_reason": "x"})])]
    rows.append({"size": "tiny", "method": "restore", "cache": "cold", "rep": 0, "error": "RuntimeError: boom"})
    t = render(rows, "Host: test", "coldstart bench container")
    assert "| tiny | warm | 65.00 (2) | 2.00 (2) | 1/2 | **32.5x** |" in t
    assert "| tiny | cold | - | - | 0/1 | - |" in t
    assert "- tiny restore cold rep 0: RuntimeError: boom" in t
