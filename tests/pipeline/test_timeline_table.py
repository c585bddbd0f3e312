"""The timeline's table stays readable: a long list or mapping attribute shows its size only."""
from __future__ import annotations

from rich.console import Console

from coldstart.pipeline.events import EventName, Timeline


def test_a_long_attribute_is_shown_by_its_size_and_kept_whole_in_the_jsonl(tmp_path) -> None:
    tl = Timeline("checkpoint")
    early = {f"pages-{i}.img": [[n * 4096, 4096] for n in range(40)] for i in range(3)}
    tl.mark(EventName.HOT_LAYOUT, child_bytes=110247936, early=early)
    console = Console(width=200, record=True)
    console.print(tl.table())
    text = console.export_text()
    assert "early=(3 entries)" in text and "child_bytes=110247936" in text
    assert "pages-1.img" not in text
    tl.write_jsonl(tmp_path / "t.jsonl")
    assert "pages-1.img" in (tmp_path / "t.jsonl").read_text()
