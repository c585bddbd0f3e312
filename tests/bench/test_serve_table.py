"""`bench serve`'s table says what a cycle after a kept-handles restore did, as measured."""
from __future__ import annotations

from coldstart.bench.serve import render


def _rows(cycle: dict) -> list[dict]:
    return [{"size": "bench-hot", "servers": {"restored": {"kept_linears": 50}, "restored+cycle": {"cycle": cycle}}}]


def test_a_cycle_that_kept_the_handles_is_not_said_to_pack_them() -> None:
    text = render(_rows({"mode": "map", "seconds": 0.002, "prepacked_linears": 0, "prepack_s": 0.0,
                         "packed_kept": 50}), "Host: x", "coldstart bench serve", 64, 128)
    assert "the cycle kept its 50 handles and packed none" in text
    assert "packs them again" not in text


def test_a_cycle_that_packed_says_how_many() -> None:
    text = render(_rows({"mode": "map", "seconds": 0.5, "prepacked_linears": 50, "prepack_s": 0.6}),
                  "Host: x", "coldstart bench serve", 64, 128)
    assert "the cycle packed 50 of them again into anonymous memory" in text
