//! A fuzz corpus pack (`corpus/<target>.pack`): for every input the fuzzer kept, its length as
//! 4 little-endian bytes, then its bytes (`corpus.py` packs and unpacks them). Read by the
//! corpus replays of both crates.
use std::path::Path;

/// The inputs of the pack at `path`.
pub fn read(path: &Path) -> Vec<Vec<u8>> {
    let blob = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut inputs = Vec::new();
    let mut i = 0;
    while i < blob.len() {
        let len = u32::from_le_bytes(blob[i..i + 4].try_into().unwrap()) as usize;
        inputs.push(blob[i + 4..i + 4 + len].to_vec());
        i += 4 + len;
    }
    inputs
}
