"""`coldstart push` / `pull` against a real registry: bit-exact round trips, no re-upload, digests
checked on the way down, failures that name the problem and leave nothing behind."""
from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coldstart.registry import artifact
from coldstart.registry.distribution import Ref, Registry, RegistryError

SMALL = {"chunk_size": 64 << 10, "pack_size": 256 << 10}  # many chunks and packs from a small tree


def same_tree(a: Path, b: Path) -> None:
    """Same entries, bytes, modes and symlink targets."""
    la = sorted(p.relative_to(a).as_posix() for p in a.rglob("*"))
    lb = sorted(p.relative_to(b).as_posix() for p in b.rglob("*"))
    assert la == lb
    for rel in la:
        pa, pb = a / rel, b / rel
        sa, sb = os.lstat(pa), os.lstat(pb)
        assert sa.st_mode == sb.st_mode, rel
        if pa.is_symlink():
            assert os.readlink(pa) == os.readlink(pb)
        elif pa.is_file():
            assert filecmp.cmp(pa, pb, shallow=False), rel


def test_round_trip_is_bit_exact_and_dedups(registry, tree, tmp_path):
    ref = f"{registry.host}/t/roundtrip:v1"
    res = artifact.push(tree, ref, **SMALL)
    assert res.uploaded == res.blobs > 3
    index, _, manifest = artifact.fetch_index(Registry(Ref.parse(ref)))
    assert manifest["artifactType"] == artifact.ARTIFACT_TYPE and len(index.packs) > 1
    dup = next(e for e in index.entries if e.path == "dup.bin")
    assert len(set(dup.chunks[:6])) == 1  # six equal chunks stored once
    assert next(e for e in index.entries if 0 in e.chunks).path == "manifest.json"  # read first: packed first
    out = artifact.pull(ref, tmp_path / "out")
    same_tree(tree, out.dir)


def test_compressible_chunks_travel_compressed_and_come_back_bit_exact(registry, tree, tmp_path):
    raw_bytes = sum(p.stat().st_size for p in tree.rglob("*") if p.is_file() and not p.is_symlink())
    packs = {}
    for compress in ("zstd", "none"):
        ref = f"{registry.host}/t/codec-{compress}:v1"
        res = artifact.push(tree, ref, **SMALL, compress=compress)
        index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
        text = [index.chunks[ci] for ci in next(e for e in index.entries if e.path == "text.txt").chunks]
        rand = [index.chunks[ci] for ci in next(e for e in index.entries if e.path == "big.bin").chunks]
        weights = [index.chunks[ci] for e in index.entries if e.path in ("weights.flat", "pages-1.img")
                   for ci in e.chunks]
        assert all(not c.codec and c.stored == c.size for c in rand)  # random bytes: kept as they are
        if compress == "zstd":
            assert all(c.codec == "zstd" and c.stored < c.size // 2 for c in text)
            # bf16 weights, in a weights file or in a process's memory: each chunk in whichever frame
            # is smaller, byte-grouped for most
            assert all(c.codec in ("zstd", artifact.GROUPED_CODEC) and c.stored < c.size * 0.8 for c in weights)
            assert sum(c.codec == artifact.GROUPED_CODEC for c in weights) > len(weights) // 2
        else:
            assert all(not c.codec and c.stored == c.size for c in text + weights)
        packs[compress] = res.total_bytes
        same_tree(tree, artifact.pull(ref, tmp_path / compress).dir)
    assert packs["zstd"] < packs["none"] and packs["none"] < raw_bytes  # (dup.bin's repeats stored once)


def test_corrupt_compressed_chunk_is_never_published(registry, tree, tmp_path):
    ref = f"{registry.host}/t/corrupt-zstd:v1"
    artifact.push(tree, ref, **SMALL)
    index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
    c = index.chunks[next(e for e in index.entries if e.path == "text.txt").chunks[1]]
    assert c.codec == "zstd"
    blob = registry.blob_path(index.packs[c.pack].digest)
    original = blob.read_bytes()
    data = bytearray(original)
    data[c.offset + c.stored // 2] ^= 0x5A
    blob.write_bytes(bytes(data))
    try:
        with pytest.raises(artifact.ArtifactError, match=r"chunk \d+ .* is corrupt"):
            artifact.pull(ref, tmp_path / "out")
    finally:
        blob.write_bytes(original)
    assert not (tmp_path / "out").exists()


def test_frames_made_while_hashing_are_sent_as_made(registry, tree, tmp_path, monkeypatch):
    """With room to keep them, the frames made while hashing are the packs' bytes: the tree is read
    and compressed once. Without (keep_bytes=0) every pack is read and compressed again, and with
    room for some, the others; all give the same packs, which pull back bit-exact."""
    encoded, packed_reads = [], []
    real_encode, real_pread = artifact._encode, os.pread
    monkeypatch.setattr(artifact, "_encode", lambda *a, **k: encoded.append(1) or real_encode(*a, **k))
    monkeypatch.setattr(artifact.os, "pread", lambda *a: packed_reads.append(1) or real_pread(*a))
    kept = artifact.push(tree, f"{registry.host}/t/kept:v1", **SMALL)
    once = len(encoded)
    assert once > 0 and not packed_reads
    encoded.clear()
    again = artifact.push(tree, f"{registry.host}/t/made-again:v1", **SMALL, keep_bytes=0)
    assert len(encoded) > once and packed_reads  # (made again for the digests, and for the upload)
    assert [p.digest for p in artifact.fetch_index(Registry(Ref.parse(f"{registry.host}/t/made-again:v1")))[0].packs] \
        == [p.digest for p in artifact.fetch_index(Registry(Ref.parse(f"{registry.host}/t/kept:v1")))[0].packs]
    assert again.total_bytes == kept.total_bytes
    same_tree(tree, artifact.pull(f"{registry.host}/t/kept:v1", tmp_path / "kept").dir)
    said: list[str] = []  # a budget smaller than the frames: some kept, the others made again
    artifact.push(tree, f"{registry.host}/t/some-kept:v1", **SMALL, keep_bytes=100 << 10, say=said.append)
    assert any("over the budget" in m for m in said), said
    assert [p.digest for p in artifact.fetch_index(Registry(Ref.parse(f"{registry.host}/t/some-kept:v1")))[0].packs] \
        == [p.digest for p in artifact.fetch_index(Registry(Ref.parse(f"{registry.host}/t/kept:v1")))[0].packs]


def test_a_file_changed_during_the_push_is_refused(registry, tmp_path, monkeypatch):
    """A file written after it was hashed: its frames, kept from before, would publish it torn; the
    push refuses it by name and puts up no manifest."""
    work = tmp_path / "tree"
    work.mkdir()
    (work / "text.txt").write_bytes(b"the same line again\n" * 20000)
    (work / "random.bin").write_bytes(os.urandom(300 << 10))
    real = artifact.build_index

    def then_write(*a, **k):
        ix = real(*a, **k)
        with open(work / "text.txt", "ab") as f:
            f.write(b"late")
        return ix

    monkeypatch.setattr(artifact, "build_index", then_write)
    ref = f"{registry.host}/t/changed:v1"
    with pytest.raises(artifact.ArtifactError, match=r"text\.txt changed while it was being pushed"):
        artifact.push(work, ref, **SMALL)
    with pytest.raises(RegistryError):
        artifact.fetch_index(Registry(Ref.parse(ref)))


def test_grouped_codec_round_trips_every_length():
    for n in (0, 1, 2, 7, 64 << 10):
        data = os.urandom(n)
        c = artifact.Chunk("", n, stored=1, codec=artifact.GROUPED_CODEC)
        frame = artifact._encode(data, artifact.GROUPED_CODEC)
        assert artifact._decode(frame, c) == data


def test_version_1_indexes_read_as_uncompressed_and_bad_codecs_are_refused():
    v1 = {"chunk_size": 4, "version": 1, "entries": [{"path": "f", "type": "file", "mode": 420, "size": 4,
                                                      "chunks": [0]}],
          "chunks": [{"digest": "blake3:" + "0" * 64, "size": 4, "pack": 0, "offset": 0}],
          "packs": [{"digest": "sha256:" + "0" * 64, "size": 4, "chunks": [0, 1]}]}
    c = artifact.Index.from_dict(v1).chunks[0]
    assert (c.stored, c.codec) == (4, "")
    for bad in ({"codec": "lz4", "stored": 3}, {"codec": "", "stored": 3}, {"codec": "zstd", "stored": 0},
                {"codec": "zstd-bg2", "stored": -1}):
        d = {**v1, "version": 2, "chunks": [{**v1["chunks"][0], **bad}]}
        with pytest.raises(artifact.ArtifactError, match="malformed artifact index"):
            artifact.Index.from_dict(d)


def test_an_index_that_would_write_outside_the_pulled_tree_is_refused():
    """The index comes from the registry: a pull writes every entry under its staging dir, so a path
    that leaves it (absolute, "..", under one of the tree's own symlinks) or a chunk or pack index
    past its list is refused before anything is written."""
    ok = {"chunk_size": 4, "version": 2, "entries": [{"path": "f", "type": "file", "mode": 420, "size": 4,
                                                      "chunks": [0]}],
          "chunks": [{"digest": "blake3:" + "0" * 64, "size": 4, "stored": 4, "codec": "", "pack": 0, "offset": 0}],
          "packs": [{"digest": "sha256:" + "0" * 64, "size": 4, "chunks": [0, 1]}]}
    artifact.Index.from_dict(ok)
    f = ok["entries"][0]
    for entries, packs in (([{**f, "path": "../f"}], None), ([{**f, "path": "/etc/f"}], None),
                           ([{**f, "path": "a/./f"}], None), ([{**f, "type": "device"}], None),
                           ([{"path": "a", "type": "symlink", "mode": 511, "target": "/etc"}, {**f, "path": "a/f"}], None),
                           ([{**f, "chunks": [1]}], None), (None, [{**ok["packs"][0], "chunks": [0, 2]}]),
                           (None, [{**ok["packs"][0], "chunks": [0]}])):
        d = {**ok, **({"entries": entries} if entries else {}), **({"packs": packs} if packs else {})}
        with pytest.raises(artifact.ArtifactError, match="malformed artifact index"):
            artifact.Index.from_dict(d)


def test_unknown_compression_is_named(registry, tree):
    with pytest.raises(artifact.ArtifactError, match="compression must be one of zstd, none, not 'lz4'"):
        artifact.push(tree, f"{registry.host}/t/lz4:v1", compress="lz4")


def test_second_push_uploads_no_blob(registry, tree):
    ref = f"{registry.host}/t/again:v1"
    first = artifact.push(tree, ref, **SMALL)
    again = artifact.push(tree, ref, **SMALL)
    assert first.uploaded > 0 and again.uploaded == 0 and again.manifest_digest == first.manifest_digest


def test_second_push_compresses_and_hashes_no_pack_again(registry, tree, monkeypatch):
    ref = f"{registry.host}/t/again-quick:v1"
    first = artifact.push(tree, ref, **SMALL)
    packed, encoded, asked = [], [], []
    real, real_encode, real_has = artifact._pack_pieces, artifact._encode, Registry.has_blob
    monkeypatch.setattr(artifact, "_pack_pieces", lambda *a, **k: packed.append(1) or real(*a, **k))
    monkeypatch.setattr(artifact, "_encode", lambda *a, **k: encoded.append(1) or real_encode(*a, **k))
    monkeypatch.setattr(Registry, "has_blob", lambda self, d: asked.append(d) or real_has(self, d))
    again = artifact.push(tree, ref, **SMALL)
    assert again.manifest_digest == first.manifest_digest and again.uploaded == 0 and not packed
    # not even the chunks stored as is (big.bin's random bytes) are tried again; each blob asked for once
    assert not encoded
    assert len(asked) == len(set(asked)) == again.blobs


def test_a_new_tag_of_the_same_tree_reuses_the_repositorys_other_tags(registry, tree, tmp_path, monkeypatch):
    """A new version pushed under a new tag: the frames and packs the repository's other tags already
    have are neither compressed nor hashed again, and nothing is uploaded but the new index."""
    artifact.push(tree, f"{registry.host}/t/versions:v1", **SMALL)
    encoded, packed = [], []
    real_encode, real_pack = artifact._encode, artifact._pack_pieces
    monkeypatch.setattr(artifact, "_encode", lambda *a, **k: encoded.append(1) or real_encode(*a, **k))
    monkeypatch.setattr(artifact, "_pack_pieces", lambda *a, **k: packed.append(1) or real_pack(*a, **k))
    v2 = artifact.push(tree, f"{registry.host}/t/versions:v2", **SMALL)
    assert not encoded and not packed and v2.uploaded == 0  # (the index blob is the same bytes too)
    same_tree(tree, artifact.pull(f"{registry.host}/t/versions:v2", tmp_path / "out").dir)
    assert Registry(Ref.parse(f"{registry.host}/t/versions:v2")).tags() == ["v1", "v2"]
    assert Registry(Ref.parse(f"{registry.host}/t/no-such-repo:v1")).tags() == []


def test_frames_that_come_out_otherwise_are_made_anew(registry, tree, tmp_path, monkeypatch):
    """Sizes known from an earlier push, packs to be made again, by a zstandard that compresses
    otherwise (here: another level): the push notices, compresses anew, and pulls back bit-exact."""
    first = f"{registry.host}/t/relevel-a:v1"
    artifact.push(tree, first, **SMALL)
    before = artifact.fetch_index(Registry(Ref.parse(first)))[0]
    monkeypatch.setattr(artifact, "_previous_index", lambda reg: before)  # its sizes; its packs are not in this repo
    monkeypatch.setattr(artifact, "ZSTD_LEVEL", 19)
    said: list[str] = []
    ref = f"{registry.host}/t/relevel-b:v1"
    artifact.push(tree, ref, **SMALL, say=said.append)
    assert any("compressing anew" in m for m in said)
    same_tree(tree, artifact.pull(ref, tmp_path / "out").dir)


def test_pull_by_digest(registry, tree, tmp_path):
    ref = f"{registry.host}/t/bydigest:v1"
    d = artifact.push(tree, ref, **SMALL).manifest_digest
    same_tree(tree, artifact.pull(f"{registry.host}/t/bydigest@{d}", tmp_path / "out").dir)


def test_corrupt_pack_in_registry_is_never_published(registry, tree, tmp_path):
    ref = f"{registry.host}/t/corrupt:v1"
    artifact.push(tree, ref, **SMALL)
    index, _, _ = artifact.fetch_index(Registry(Ref.parse(ref)))
    blob = registry.blob_path(index.packs[1].digest)
    original = blob.read_bytes()
    data = bytearray(original)
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    try:
        with pytest.raises(artifact.ArtifactError, match=r"chunk \d+ .* is corrupt"):
            artifact.pull(ref, tmp_path / "out")
    finally:
        blob.write_bytes(original)  # the module's registry stores each pack once: later pushes reuse it
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no staging dir left


def test_a_pull_clears_what_a_killed_pull_staged_and_leaves_a_live_ones(registry, tree, tmp_path):
    """A pull SIGKILLed mid-write (a pod evicted) leaves its hidden staging dir: no directory at the
    destination, but the snapshot's size on disk. The next pull to that destination removes it once
    its writer is gone, never a live writer's, and nothing else hidden there."""
    import subprocess
    import sys

    ref = f"{registry.host}/t/killed:v1"
    artifact.push(tree, ref, **SMALL)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now
    dead = tmp_path / f".out.pull-{gone.pid}"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "big.bin").write_bytes(b"x" * 4096)
    nested = tmp_path / f"..out.pull-{gone.pid}.pull-{gone.pid}"  # a `pull --pack`'s pull, staged in its own
    nested.mkdir()
    live = tmp_path / f".out.pull-{os.getppid()}"  # its writer lives
    live.mkdir()
    mine = tmp_path / ".out.notes"
    mine.write_text("a user's file")
    same_tree(tree, artifact.pull(ref, tmp_path / "out").dir)
    assert not dead.exists() and not nested.exists()
    assert live.exists() and mine.exists()


def test_unreachable_registry_is_one_line(tmp_path):
    from coldstart.engine.launcher import free_port

    with pytest.raises(RegistryError, match=r"unreachable or too slow \(ConnectionError: Connection refused\)$"):
        artifact.pull(f"127.0.0.1:{free_port()}/t/none:v1", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cli_push_pull_and_errors(registry, tree, tmp_path):
    """(A tree with a manifest.json is a snapshot to the CLI: it is verified against it first, and
    the fixture's "{}" is no snapshot manifest; tests/registry/test_snapshot_registry.py pushes one.)"""
    cs = [sys.executable, "-m", "coldstart.cli"]
    p = subprocess.run([*cs, "push", str(tree), f"{registry.host}/t/notasnapshot:v1"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0 and "not a coldstart snapshot manifest" in p.stderr
    subprocess.run(["cp", "-a", str(tree), str(tmp_path / "plain")], check=True)  # FIFO and socket as they are
    tree = tmp_path / "plain"
    (tree / "manifest.json").unlink()
    ref = f"{registry.host}/t/cli:v1"
    p = subprocess.run([*cs, "push", str(tree), ref, "--chunk-kib", "64", "--pack-mib", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([*cs, "push", str(tree), f"{registry.host}/t/cli-made-again:v1", "--chunk-kib", "64",
                        "--pack-mib", "1", "--memory-mib", "0"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "0 MiB of frames kept in memory" in p.stderr, p.stderr  # none kept, as asked
    p = subprocess.run([*cs, "pull", ref, str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    same_tree(tree, tmp_path / "out")
    for argv, needle in [(["pull", ref, str(tmp_path / "out")], "already exists"),
                         (["pull", f"{registry.host}/t/missing:v1", str(tmp_path / "m")], "no manifest"),
                         (["push", str(tmp_path / "nope"), ref], "no such directory"),
                         (["pull", "not a ref", str(tmp_path / "x")], "not a registry reference"),
                         (["pull", ref, str(tmp_path / "out" / "big.bin" / "a" / "x")], "Not a directory")]:
        p = subprocess.run([*cs, *argv], capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and needle in p.stderr, (argv, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    for opt in ("--chunk-kib", "--pack-mib", "--threads"):  # a chunk of 0 bytes pushed files as nothing
        p = subprocess.run([*cs, "push", str(tree), f"{registry.host}/t/zero:v1", opt, "0"], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and "Invalid value for '" + opt in p.stderr, (opt, p.stderr)


def test_refs_parse():
    r = Ref.parse("127.0.0.1:5000/a/b:v1")
    assert (r.host, r.repo, r.tag, r.scheme) == ("127.0.0.1:5000", "a/b", "v1", "http")
    assert Ref.parse("registry.example.com/x").scheme == "https"
    assert Ref.parse("localhost:5000/x@sha256:" + "0" * 64).reference == "sha256:" + "0" * 64


def test_pull_of_more_files_than_the_descriptor_limit(registry, tmp_path):
    """A runtime tree (a venv: 63 k files) has more files than a process may hold open at once."""
    import resource

    root = tmp_path / "many"
    root.mkdir()
    for i in range(300):
        (root / f"f{i:03}.py").write_text(f"x = {i}\n" * (i + 1))
    ref = f"{registry.host}/t/many:v1"
    artifact.push(root, ref, **SMALL)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        out = artifact.pull(ref, tmp_path / "pulled").dir
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    same_tree(root, out)


def test_index_puts_the_restorers_reads_among_the_prefetched_chunks(tiny_snapshot):
    """The page runs CRIU's restorer reads (not maps) come before the restored server runs, so no
    access profile names them: the index still orders them before the rest, inside the prefix a
    lazy mount prefetches ("profiled")."""
    from coldstart.criu.images import read_runs

    root = tiny_snapshot.out
    runs = read_runs(root / "criu")
    assert runs
    index = artifact.build_index(root)
    by_path = {e.path: e for e in index.entries if e.type == "file"}
    for path, off, n in runs[:50] + runs[-50:]:
        e = by_path[str(path.relative_to(root))]
        for k in range(off // index.chunk_size, (off + n - 1) // index.chunk_size + 1):
            assert e.chunks[k] < index.profiled, (path.name, off, n)
