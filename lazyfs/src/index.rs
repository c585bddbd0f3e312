//! The published tree's index and the inode table built from it.
//!
//! The index is the JSON of `Index.to_bytes()` in toolkit/coldstart/registry/artifact.py: entries
//! (relative "/"-separated paths, sorted; every parent listed as a dir except the root), each file
//! a list of chunk indices; each chunk a BLAKE3 digest of its bytes, a size, a place (pack,
//! offset) and how it is stored there (version 2: `stored` bytes, `codec` "" as is, "zstd" one
//! zstd frame, or "zstd-bg2" one zstd frame of the chunk's even bytes then its odd bytes; version 1
//! has neither: as is); each pack a registry blob. Everything is checked here, once, so the
//! filesystem can index without bounds surprises: a malformed index is a startup error, never an
//! EIO later.
//!
//! Inode numbers are stable: the root is 1, `entries[i]` is i + 2.

use std::collections::HashMap;

use serde::Deserialize;

pub const ROOT: u64 = 1;
const VERSIONS: [u32; 2] = [1, 2];

#[derive(Deserialize)]
struct RawIndex {
    chunk_size: u64,
    entries: Vec<RawEntry>,
    chunks: Vec<RawChunk>,
    packs: Vec<RawPack>,
    version: u32,
    #[serde(default)]
    profiled: usize,
}

#[derive(Deserialize)]
struct RawEntry {
    path: String,
    #[serde(rename = "type")]
    kind: String,
    mode: u32,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    target: String,
    #[serde(default)]
    chunks: Vec<u64>,
}

#[derive(Deserialize)]
struct RawChunk {
    digest: String,
    size: u64,
    pack: i64,
    offset: u64,
    #[serde(default)]
    stored: Option<u64>,
    #[serde(default)]
    codec: String,
}

#[derive(Deserialize)]
struct RawPack {
    digest: String,
    size: u64,
}

pub struct Chunk {
    pub hash: blake3::Hash, // of the chunk's bytes (decompressed)
    pub size: usize,
    pub pack: usize,
    pub offset: u64,   // within the pack
    pub stored: usize, // bytes in the pack
    pub codec: Codec,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Codec {
    Raw,
    Zstd,
    /// a zstd frame of the chunk's bytes grouped by position: the even ones, then the odd ones
    ZstdBg2,
}

pub struct Pack {
    pub digest: String, // "sha256:<hex>", the blob's name in the registry
    pub size: u64,
}

pub enum Kind {
    Dir { children: Vec<u64> },                             // sorted by name
    File { size: u64, chunks: Vec<u32>, starts: Vec<u64> }, // starts[k]: file offset of chunks[k]
    Symlink { target: String },
    Socket, // a unix socket's file in the tree (a snapshot's run dir keeps vLLM's): no data
    Fifo,
}

pub struct Node {
    pub parent: u64,
    pub name: String,
    pub mode: u16,
    pub kind: Kind,
}

pub struct Index {
    pub chunk_size: u64,
    pub chunks: Vec<Chunk>,
    /// How many chunks, from the first, the access profile names (what a restore reads first)
    pub profiled: usize,
    pub packs: Vec<Pack>,
    nodes: Vec<Node>, // nodes[ino - 1]
}

impl Index {
    pub fn parse(raw: &[u8]) -> Result<Index, String> {
        let raw: RawIndex = serde_json::from_slice(raw).map_err(|e| e.to_string())?;
        if !VERSIONS.contains(&raw.version) {
            return Err(format!("index version {} is not one of {VERSIONS:?}", raw.version));
        }
        let packs: Vec<Pack> = raw.packs.into_iter().map(|p| Pack { digest: p.digest, size: p.size }).collect();
        for p in &packs {
            let hex = p.digest.strip_prefix("sha256:").unwrap_or("");
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("pack digest {:?} is not sha256:<hex>", p.digest));
            }
        }
        let mut chunks = Vec::with_capacity(raw.chunks.len());
        for (i, c) in raw.chunks.into_iter().enumerate() {
            let hash = c
                .digest
                .strip_prefix("blake3:")
                .and_then(|h| blake3::Hash::from_hex(h).ok())
                .ok_or_else(|| format!("chunk {i}: digest {:?} is not blake3:<hex>", c.digest))?;
            let pack = usize::try_from(c.pack).ok().filter(|&p| p < packs.len());
            let pack = pack.ok_or_else(|| format!("chunk {i}: pack {} out of range", c.pack))?;
            let codec = match c.codec.as_str() {
                "" => Codec::Raw,
                "zstd" => Codec::Zstd,
                "zstd-bg2" => Codec::ZstdBg2,
                other => return Err(format!("chunk {i}: unknown codec {other:?}")),
            };
            let stored = c.stored.unwrap_or(c.size);
            if c.size == 0 || stored == 0 || (codec == Codec::Raw && stored != c.size) {
                return Err(format!("chunk {i}: {stored} bytes stored for {} ({:?})", c.size, c.codec));
            }
            if c.offset.checked_add(stored).is_none_or(|end| end > packs[pack].size) {
                return Err(format!("chunk {i}: bytes {}+{stored} are not inside pack {pack}", c.offset));
            }
            chunks.push(Chunk { hash, size: c.size as usize, pack, offset: c.offset, stored: stored as usize, codec });
        }

        let mut nodes =
            vec![Node { parent: ROOT, name: String::new(), mode: 0o755, kind: Kind::Dir { children: vec![] } }];
        let mut by_path: HashMap<&str, u64> = HashMap::from([("", ROOT)]);
        for (i, e) in raw.entries.iter().enumerate() {
            by_path.insert(e.path.as_str(), i as u64 + 2);
        }
        for e in &raw.entries {
            let (dir, name) = e.path.rsplit_once('/').unwrap_or(("", &e.path));
            if name.is_empty() || name == "." || name == ".." {
                return Err(format!("entry {:?}: not a relative path", e.path));
            }
            let parent =
                *by_path.get(dir).ok_or_else(|| format!("entry {:?}: parent {dir:?} is not listed", e.path))?;
            let kind = match e.kind.as_str() {
                "dir" => Kind::Dir { children: vec![] },
                "symlink" => Kind::Symlink { target: e.target.clone() },
                "file" => file_kind(e, &chunks)?,
                "socket" => Kind::Socket,
                "fifo" => Kind::Fifo,
                other => return Err(format!("entry {:?}: unknown type {other:?}", e.path)),
            };
            nodes.push(Node { parent, name: name.to_string(), mode: (e.mode & 0o7777) as u16, kind });
        }
        // children lists, then a check that every parent is a directory
        for ino in 2..=nodes.len() as u64 {
            let parent = nodes[ino as usize - 1].parent;
            match &mut nodes[parent as usize - 1].kind {
                Kind::Dir { children } => children.push(ino),
                _ => return Err(format!("entry {:?}: parent is not a directory", raw.entries[ino as usize - 2].path)),
            }
        }
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        for n in nodes.iter_mut() {
            if let Kind::Dir { children } = &mut n.kind {
                children.sort_by(|a, b| names[*a as usize - 1].cmp(&names[*b as usize - 1]));
                if children.windows(2).any(|w| names[w[0] as usize - 1] == names[w[1] as usize - 1]) {
                    return Err("two entries have the same path".into());
                }
            }
        }
        let profiled = raw.profiled.min(chunks.len());
        Ok(Index { chunk_size: raw.chunk_size, chunks, packs, nodes, profiled })
    }

    pub fn node(&self, ino: u64) -> Option<&Node> {
        self.nodes.get((ino as usize).wrapping_sub(1))
    }

    pub fn len(&self) -> u64 {
        self.nodes.len() as u64
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Option<u64> {
        let Kind::Dir { children } = &self.node(parent)?.kind else { return None };
        let i = children.binary_search_by(|c| self.nodes[*c as usize - 1].name.as_bytes().cmp(name)).ok()?;
        Some(children[i])
    }

    /// Total bytes of regular files (statfs).
    pub fn file_bytes(&self) -> u64 {
        self.nodes.iter().map(|n| if let Kind::File { size, .. } = n.kind { size } else { 0 }).sum()
    }
}

fn file_kind(e: &RawEntry, chunks: &[Chunk]) -> Result<Kind, String> {
    let mut ids = Vec::with_capacity(e.chunks.len());
    let mut starts = Vec::with_capacity(e.chunks.len());
    let mut off = 0u64;
    for &ci in &e.chunks {
        let c = chunks.get(ci as usize).ok_or_else(|| format!("entry {:?}: chunk {ci} out of range", e.path))?;
        ids.push(ci as u32);
        starts.push(off);
        off += c.size as u64;
    }
    if off != e.size {
        return Err(format!("entry {:?}: chunks hold {off} bytes, size is {}", e.path, e.size));
    }
    Ok(Kind::File { size: e.size, chunks: ids, starts })
}

/// The chunks (positions k in the file's list) that hold bytes [offset, end) of a file.
pub fn chunk_span(starts: &[u64], offset: u64, end: u64) -> std::ops::Range<usize> {
    let first = starts.partition_point(|&s| s <= offset).saturating_sub(1);
    let last = starts.partition_point(|&s| s < end);
    first..last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(b: &[u8]) -> String {
        format!("blake3:{}", blake3::hash(b).to_hex())
    }

    fn sample() -> String {
        let pack = format!("sha256:{}", "a".repeat(64));
        format!(
            r#"{{"chunk_size":4,"entries":[
                {{"path":"d","type":"dir","mode":493,"size":0,"target":"","chunks":[]}},
                {{"path":"d/f","type":"file","mode":420,"size":6,"target":"","chunks":[0,1]}},
                {{"path":"l","type":"symlink","mode":511,"size":0,"target":"d/f","chunks":[]}}],
              "chunks":[{{"digest":"{}","size":4,"pack":0,"offset":0}},{{"digest":"{}","size":2,"pack":0,"offset":4}}],
              "packs":[{{"digest":"{pack}","size":6,"chunks":[0,2]}}],"profiled":0,"version":1,"kind":"coldstart.tree"}}"#,
            digest(b"abcd"),
            digest(b"ef")
        )
    }

    #[test]
    fn inodes_follow_index_order_and_lookup_finds_children() {
        let ix = Index::parse(sample().as_bytes()).unwrap();
        assert_eq!(ix.lookup(ROOT, b"d"), Some(2));
        assert_eq!(ix.lookup(2, b"f"), Some(3));
        assert_eq!(ix.lookup(ROOT, b"l"), Some(4));
        assert_eq!(ix.lookup(ROOT, b"missing"), None);
        assert!(matches!(ix.node(3).unwrap().kind, Kind::File { size: 6, .. }));
    }

    #[test]
    fn a_file_whose_chunks_do_not_add_up_is_refused() {
        let bad = sample().replace(r#""size":6,"target":"","chunks":[0,1]"#, r#""size":7,"target":"","chunks":[0,1]"#);
        assert!(Index::parse(bad.as_bytes()).err().expect("refused").contains("size is 7"));
    }

    #[test]
    fn version_1_chunks_are_stored_as_is_and_version_2_names_its_codec() {
        let ix = Index::parse(sample().as_bytes()).unwrap();
        assert!(ix.chunks.iter().all(|c| c.codec == Codec::Raw && c.stored == c.size));
        let v2 = sample()
            .replace(r#""size":4,"pack":0,"offset":0}"#, r#""size":4,"pack":0,"offset":0,"stored":3,"codec":"zstd"}"#)
            .replace(r#""size":2,"pack":0,"offset":4}"#, r#""size":2,"pack":0,"offset":3,"stored":2,"codec":""}"#)
            .replace(r#""version":1"#, r#""version":2"#);
        let ix = Index::parse(v2.as_bytes()).unwrap();
        assert!(ix.chunks[0].codec == Codec::Zstd && ix.chunks[0].stored == 3 && ix.chunks[1].codec == Codec::Raw);
        let grouped = v2.replace(r#""codec":"zstd""#, r#""codec":"zstd-bg2""#);
        assert_eq!(Index::parse(grouped.as_bytes()).unwrap().chunks[0].codec, Codec::ZstdBg2);
        let unknown = v2.replace(r#""codec":"zstd""#, r#""codec":"lz4""#);
        assert!(Index::parse(unknown.as_bytes()).err().expect("refused").contains("unknown codec"));
        let raw_short = v2.replace(r#""stored":2,"codec":"""#, r#""stored":1,"codec":"""#);
        assert!(Index::parse(raw_short.as_bytes()).err().expect("refused").contains("stored"));
        let outside = v2.replace(r#""stored":3,"#, r#""stored":9,"#);
        assert!(Index::parse(outside.as_bytes()).err().expect("refused").contains("not inside pack"));
    }

    #[test]
    fn chunk_span_covers_exactly_the_overlapping_chunks() {
        let starts = [0, 4, 8];
        assert_eq!(chunk_span(&starts, 0, 4), 0..1);
        assert_eq!(chunk_span(&starts, 3, 5), 0..2);
        assert_eq!(chunk_span(&starts, 4, 12), 1..3);
        assert_eq!(chunk_span(&starts, 9, 10), 2..3);
    }
}
