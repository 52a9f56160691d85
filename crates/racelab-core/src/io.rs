//! `.npy` input and output (format versions 1.0, 2.0 and 3.0).
//!
//! Reads little- or big-endian `f4`/`f8` arrays in C or Fortran order (Fortran data is
//! transposed to row-major on load) and returns `f64`; writes little-endian `f4` or `f8` in C
//! order, version 1.0. Anything else (other dtypes, truncated data, a broken header) is a
//! [`RaceError::Npy`] naming the file and what is wrong.

#![deny(missing_docs)]

use crate::error::{RaceError, Result};
use crate::params::{Bits, Tables};
use crate::tensor::Tensor;
use std::path::Path;

const MAGIC: &[u8] = b"\x93NUMPY";

/// Element type of an array on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// `<f4` / `>f4`.
    F32,
    /// `<f8` / `>f8`.
    F64,
}

impl Dtype {
    /// Both element types, in the order the command line lists them.
    pub const ALL: [Dtype; 2] = [Dtype::F32, Dtype::F64];

    /// The lowercase name (`--dtype`).
    pub fn name(&self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
        }
    }

    /// One line on the type (`--help`).
    pub fn about(&self) -> &'static str {
        match self {
            Dtype::F32 => "`<f4` / `>f4`",
            Dtype::F64 => "`<f8` / `>f8`",
        }
    }
}

/// An array read from `.npy`, converted to f64, with its on-disk dtype.
#[derive(Debug, Clone)]
pub struct NpyArray {
    /// The values, widened to f64 (exactly).
    pub tensor: Tensor<f64>,
    /// The element type on disk.
    pub dtype: Dtype,
}

fn bad(path: &str, msg: impl Into<String>) -> RaceError {
    RaceError::Npy {
        path: path.to_string(),
        msg: msg.into(),
    }
}

/// An array read from `.npy` in its on-disk element type (no conversion).
#[derive(Debug, Clone)]
pub enum NpyData {
    /// An f32 array.
    F32(Tensor<f32>),
    /// An f64 array.
    F64(Tensor<f64>),
}

impl NpyData {
    /// The element type.
    pub fn dtype(&self) -> Dtype {
        match self {
            NpyData::F32(_) => Dtype::F32,
            NpyData::F64(_) => Dtype::F64,
        }
    }
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        match self {
            NpyData::F32(t) => &t.shape,
            NpyData::F64(t) => &t.shape,
        }
    }
    /// The array widened to f64 (moved when it is f64 already).
    pub fn into_f64(self) -> Tensor<f64> {
        match self {
            NpyData::F32(t) => t.map(|x| x as f64),
            NpyData::F64(t) => t,
        }
    }
}

/// Read an `.npy` file in its own element type: an f32 file stays f32.
pub fn read_npy_native(path: &Path) -> Result<NpyData> {
    let bytes = std::fs::read(path).map_err(|e| RaceError::io(path, e))?;
    parse_npy_native(&bytes, &path.display().to_string())
}

/// Parse `.npy` bytes in their own element type; `name` is used in error messages.
pub fn parse_npy_native(bytes: &[u8], name: &str) -> Result<NpyData> {
    let h = parse_header(bytes, name)?;
    let body = &bytes[h.offset..];
    check_body(&h, body.len(), name)?;
    Ok(match h.dtype {
        Dtype::F32 => NpyData::F32(decode(&h, body, |c| h.value(c) as f32)),
        Dtype::F64 => NpyData::F64(decode(&h, body, |c| h.value(c))),
    })
}

/// The body's values in C order, each decoded by `value`.
fn decode<T: Copy + Default>(h: &NpyHeader, body: &[u8], value: impl Fn(&[u8]) -> T) -> Tensor<T> {
    let mut data: Vec<T> = body.chunks_exact(h.width()).map(value).collect();
    if h.fortran && h.shape.len() > 1 {
        data = fortran_to_c(&data, &h.shape);
    }
    Tensor {
        shape: h.shape.clone(),
        data,
    }
}

/// Read an `.npy` file.
pub fn read_npy(path: &Path) -> Result<NpyArray> {
    let bytes = std::fs::read(path).map_err(|e| RaceError::io(path, e))?;
    parse_npy(&bytes, &path.display().to_string())
}

/// An `.npy` header: the element type and byte order, the layout, the shape and where the
/// data starts.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyHeader {
    /// The element type on disk.
    pub dtype: Dtype,
    /// Big-endian values (`>`).
    pub big_endian: bool,
    /// Column-major (`fortran_order: True`).
    pub fortran: bool,
    /// The shape.
    pub shape: Vec<usize>,
    /// Byte offset of the data.
    pub offset: usize,
}

impl NpyHeader {
    /// Elements in the array.
    pub fn count(&self) -> usize {
        self.shape.iter().product()
    }
    /// Bytes per element.
    pub fn width(&self) -> usize {
        if self.dtype == Dtype::F32 {
            4
        } else {
            8
        }
    }
    /// One element from its bytes.
    fn value(&self, b: &[u8]) -> f64 {
        match (self.dtype, self.big_endian) {
            (Dtype::F32, false) => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            (Dtype::F32, true) => f32::from_be_bytes(b.try_into().unwrap()) as f64,
            (Dtype::F64, false) => f64::from_le_bytes(b.try_into().unwrap()),
            (Dtype::F64, true) => f64::from_be_bytes(b.try_into().unwrap()),
        }
    }
}

/// Parse the header at the start of `bytes` (which must hold at least all of it); `name` is
/// used in error messages.
pub fn parse_header(bytes: &[u8], name: &str) -> Result<NpyHeader> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad(
            name,
            "missing the \\x93NUMPY magic string; not an .npy file",
        ));
    }
    let major = bytes[6];
    let (hlen, start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(bad(name, "truncated header"));
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        v => {
            return Err(bad(
                name,
                format!("unsupported .npy format version {v}; expected 1, 2 or 3"),
            ))
        }
    };
    if bytes.len() < start + hlen {
        return Err(bad(name, "truncated header"));
    }
    let header = std::str::from_utf8(&bytes[start..start + hlen])
        .map_err(|_| bad(name, "header is not text"))?;
    let descr = header_value(header, "descr").ok_or_else(|| bad(name, "header lacks 'descr'"))?;
    let fortran = header_value(header, "fortran_order")
        .ok_or_else(|| bad(name, "header lacks 'fortran_order'"))?;
    let shape_s = header_value(header, "shape").ok_or_else(|| bad(name, "header lacks 'shape'"))?;
    let descr = descr.trim().trim_matches(|c| c == '\'' || c == '"');
    let (dtype, big_endian) = match descr {
        "<f4" | "|f4" | "=f4" => (Dtype::F32, false),
        ">f4" => (Dtype::F32, true),
        "<f8" | "|f8" | "=f8" => (Dtype::F64, false),
        ">f8" => (Dtype::F64, true),
        d => {
            return Err(bad(name, format!("unsupported dtype '{d}'; racelab reads float32 ('<f4') and float64 ('<f8'): convert with arr.astype(np.float32)")))
        }
    };
    let fortran = match fortran.trim() {
        "False" => false,
        "True" => true,
        f => {
            return Err(bad(
                name,
                format!("fortran_order is '{f}', expected True or False"),
            ))
        }
    };
    let shape = parse_shape(shape_s.trim())
        .ok_or_else(|| bad(name, format!("malformed shape '{}'", shape_s.trim())))?;
    shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .and_then(|c| c.checked_mul(8))
        .ok_or_else(|| bad(name, "shape overflows"))?;
    Ok(NpyHeader {
        dtype,
        big_endian,
        fortran,
        shape,
        offset: start + hlen,
    })
}

/// Check that `data_len` bytes follow the header: exactly the array's.
fn check_body(h: &NpyHeader, data_len: usize, name: &str) -> Result<()> {
    let need = h.count() * h.width();
    if data_len < need {
        return Err(bad(
            name,
            format!(
                "truncated data: shape {:?} needs {} bytes, file has {}",
                h.shape, need, data_len
            ),
        ));
    }
    if data_len > need {
        return Err(bad(
            name,
            format!(
                "{} trailing bytes after the data of shape {:?}",
                data_len - need,
                h.shape
            ),
        ));
    }
    Ok(())
}

/// The header of the `.npy` file at `path`, read without its data; the file's length is
/// checked against the shape.
pub fn read_npy_header(path: &Path) -> Result<NpyHeader> {
    use std::io::Read;
    let name = path.display().to_string();
    let mut f = std::fs::File::open(path).map_err(|e| RaceError::io(path, e))?;
    let mut head = vec![0u8; 12];
    let got = f.read(&mut head).map_err(|e| RaceError::io(path, e))?;
    head.truncate(got);
    let hlen = match head.get(6) {
        Some(1) if got >= 10 => u16::from_le_bytes([head[8], head[9]]) as usize + 10,
        Some(2 | 3) if got >= 12 => {
            u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize + 12
        }
        _ => head.len(),
    };
    let len = f.metadata().map_err(|e| RaceError::io(path, e))?.len();
    if hlen as u64 > len {
        return Err(bad(&name, "truncated header"));
    }
    if hlen > head.len() {
        let mut rest = vec![0u8; hlen - head.len()];
        let more = f.read(&mut rest).map_err(|e| RaceError::io(path, e))?;
        head.extend_from_slice(&rest[..more]);
    }
    let h = parse_header(&head, &name)?;
    check_body(&h, (len as usize).saturating_sub(h.offset), &name)?;
    Ok(h)
}

/// Rows `a..b` of the token axis (the second-to-last) of the C-order `.npy` array at `path`
/// with header `h` (`[N, cols]`, `[H, N, cols]` or `[B, H, N, cols]`), as `[lead, b − a, cols]`
/// f32: one seek and one read per leading index, never the whole file.
pub fn read_npy_rows(path: &Path, h: &NpyHeader, (a, b): (usize, usize)) -> Result<Vec<f32>> {
    use std::io::{Read, Seek, SeekFrom};
    let name = path.display().to_string();
    let nd = h.shape.len();
    if nd < 2 {
        return Err(bad(
            &name,
            format!(
                "shape {:?} has no token axis; give [N, d], [H, N, d] or [B, H, N, d]",
                h.shape
            ),
        ));
    }
    if h.fortran {
        return Err(bad(&name, "Fortran order: a rank's tokens are not contiguous; save it with np.save(path, np.ascontiguousarray(x))"));
    }
    let (n, cols) = (h.shape[nd - 2], h.shape[nd - 1]);
    if a > b || b > n {
        return Err(bad(
            &name,
            format!("rows {a}..{b} are outside the {n} tokens"),
        ));
    }
    let lead: usize = h.shape[..nd - 2].iter().product();
    let w = h.width();
    let mut f = std::fs::File::open(path).map_err(|e| RaceError::io(path, e))?;
    let mut bytes = vec![0u8; (b - a) * cols * w];
    let mut out = Vec::with_capacity(lead * (b - a) * cols);
    for i in 0..lead {
        let at = h.offset + (i * n + a) * cols * w;
        f.seek(SeekFrom::Start(at as u64))
            .and_then(|_| f.read_exact(&mut bytes))
            .map_err(|e| RaceError::io(path, e))?;
        out.extend(bytes.chunks_exact(w).map(|c| h.value(c) as f32));
    }
    Ok(out)
}

/// Parse `.npy` bytes; `name` is used in error messages.
pub fn parse_npy(bytes: &[u8], name: &str) -> Result<NpyArray> {
    let h = parse_header(bytes, name)?;
    let body = &bytes[h.offset..];
    check_body(&h, body.len(), name)?;
    Ok(NpyArray {
        tensor: decode(&h, body, |c| h.value(c)),
        dtype: h.dtype,
    })
}

/// Reorder column-major data of `shape` into row-major.
fn fortran_to_c<T: Copy + Default>(data: &[T], shape: &[usize]) -> Vec<T> {
    let n = data.len();
    let mut out = vec![T::default(); n];
    let rank = shape.len();
    let mut idx = vec![0usize; rank];
    for (c_pos, o) in out.iter_mut().enumerate() {
        // Decode the C-order multi-index, then encode it in F order.
        let mut rem = c_pos;
        for a in (0..rank).rev() {
            idx[a] = rem % shape[a];
            rem /= shape[a];
        }
        let mut f_pos = 0;
        for a in (0..rank).rev() {
            f_pos = f_pos * shape[a] + idx[a];
        }
        *o = data[f_pos];
    }
    out
}

/// The raw text of `key`'s value in a Python-dict header.
fn header_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat1 = format!("'{key}':");
    let pat2 = format!("\"{key}\":");
    let pos = header
        .find(&pat1)
        .map(|p| p + pat1.len())
        .or_else(|| header.find(&pat2).map(|p| p + pat2.len()))?;
    let rest = &header[pos..];
    let rest_t = rest.trim_start();
    if rest_t.starts_with('(') {
        let end = rest_t.find(')')?;
        return Some(&rest_t[..=end]);
    }
    let end = rest_t.find([',', '}']).unwrap_or(rest_t.len());
    Some(&rest_t[..end])
}

fn parse_shape(s: &str) -> Option<Vec<usize>> {
    let inner = s.strip_prefix('(')?.strip_suffix(')')?;
    inner
        .split(',')
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| t.trim_end_matches('L').parse::<usize>().ok())
        .collect()
}

/// Serialise an array to `.npy` bytes (version 1.0, C order, little-endian).
pub fn npy_bytes<T: Copy + Into<f64>>(shape: &[usize], data: &[T], dtype: Dtype) -> Vec<u8> {
    let descr = if dtype == Dtype::F32 { "<f4" } else { "<f8" };
    let shape_s = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_s}, }}");
    // Pad so that magic + version + len + header + '\n' is a multiple of 64.
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len() * 8);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for &x in data {
        let x: f64 = x.into();
        match dtype {
            // Exact for f32 data (widened then narrowed); rounds f64 data once.
            Dtype::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            Dtype::F64 => out.extend_from_slice(&x.to_le_bytes()),
        }
    }
    out
}

/// Write an array to an `.npy` file.
pub fn write_npy<T: Copy + Into<f64>>(
    path: &Path,
    shape: &[usize],
    data: &[T],
    dtype: Dtype,
) -> Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent).map_err(|e| RaceError::io(parent, e))?;
        }
    }
    write_atomic(path, &npy_bytes(shape, data, dtype))
}

/// Write `bytes` to `path` atomically ([`write_with`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_with(path, |w| std::io::Write::write_all(w, bytes))
}

/// Write `path` atomically: `fill` writes a temporary file in the same folder
/// (`.NAME.tmp-PID-K`), which is flushed to disk and then renamed over `path`. A run killed or
/// failing part-way leaves the old file (or none), never a truncated one; a failed write
/// removes its temporary file.
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| RaceError::io(path, "not a file name"))?;
    let stem = format!(".{}.tmp-", name.to_string_lossy());
    remove_stale_temporaries(path, &stem);
    let tmp = path.with_file_name(format!(
        "{stem}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        fill(&mut w)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        std::fs::remove_file(&tmp).ok();
    }
    written.map_err(|e| RaceError::io(path, e))
}

/// Remove the temporaries `STEM<pid>-<k>` beside `path` that a killed run left (its process is
/// gone: no `/proc/<pid>`; where there is no `/proc`, nothing is removed).
fn remove_stale_temporaries(path: &Path, stem: &str) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let pid = name
            .strip_prefix(stem)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                std::fs::remove_file(e.path()).ok();
            }
        }
    }
}

/// Read planes of shape `[L, P, d]`.
pub fn read_planes(path: &Path) -> Result<crate::hashing::Planes> {
    let arr = read_npy(path)?;
    match arr.tensor.shape.as_slice() {
        [l, p, d] => crate::hashing::Planes::from_data(Bits(*p), Tables(*l), *d, arr.tensor.data),
        s => Err(bad(
            &path.display().to_string(),
            format!("planes must have shape [L, P, d], got {s:?}"),
        )),
    }
}

/// Write planes as `[L, P, d]` f64.
pub fn write_planes(path: &Path, planes: &crate::hashing::Planes) -> Result<()> {
    write_npy(path, &[planes.l, planes.p, planes.d], &planes.w, Dtype::F64)
}

/// The identity of an existing file: device and inode (on Unix; elsewhere its canonical path).
fn file_id(path: &Path) -> Option<(u64, u64, std::path::PathBuf)> {
    let m = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((m.dev(), m.ino(), std::path::PathBuf::new()))
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        Some((0, 0, std::fs::canonicalize(path).ok()?))
    }
}

/// Where a path will be: its folder canonicalised, and its file name (for an output that does
/// not exist yet).
fn planned_location(path: &Path) -> Option<std::path::PathBuf> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(std::fs::canonicalize(dir).ok()?.join(path.file_name()?))
}

/// Check, before any work starts, that an output file can be written without destroying what
/// racelab did not write: `path` (the flag `arg`) is not a symbolic link (a rename would replace
/// the link, not its target: give the target's path), not a folder, device, FIFO or socket
/// (racelab replaces its outputs by renaming a new file over them), not the same file as any
/// of `inputs` (compared by device and inode, so a hard link or another spelling is caught),
/// not the same path as any of `others` (the other outputs of the same run), and its folder
/// exists and takes a new file (a probe file is created there and removed).
pub fn check_output_file(
    path: &Path,
    arg: &str,
    inputs: &[(&str, &Path)],
    others: &[(&str, &Path)],
) -> Result<()> {
    let refuse = |msg: String| Err(RaceError::param(arg, msg));
    let shown = path.display();
    if let Ok(m) = std::fs::symlink_metadata(path) {
        let t = m.file_type();
        if t.is_symlink() {
            return refuse(format!("`{shown}` is a symbolic link; racelab writes a new file and renames it over the path, which would replace the link rather than write through it: give the link's target"));
        }
        if t.is_dir() {
            return refuse(format!("`{shown}` is a folder: give a file name"));
        }
        if !t.is_file() {
            return refuse(format!("`{shown}` exists and is not a regular file (a device, FIFO or socket); racelab replaces its outputs by renaming a new file over them: give a file name"));
        }
        if let Some(id) = file_id(path) {
            for (name, input) in inputs {
                if file_id(input).as_ref() == Some(&id) {
                    return refuse(format!("`{shown}` is the same file as the input --{name} (`{}`): writing it would destroy the input; give another file", input.display()));
                }
            }
        }
    }
    let here = planned_location(path);
    for (name, other) in others {
        let same = match (file_id(path), file_id(other)) {
            (Some(a), Some(b)) => a == b,
            _ => here.is_some() && here == planned_location(other),
        };
        if same {
            return refuse(format!("`{shown}` is also the output of --{name}: one would overwrite the other; give two different files"));
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return refuse(format!(
            "the folder of `{shown}` does not exist: create it first"
        ));
    }
    let probe = dir.join(format!(".racelab-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            std::fs::remove_file(&probe).ok();
            Ok(())
        }
        Err(e) => refuse(format!(
            "the folder of `{shown}` does not take a new file ({e}): give a writable folder"
        )),
    }
}

/// Check, before any work starts, that an output folder (the flag `arg`) is a folder or a new
/// path: an existing file, device or FIFO there is refused, and so is a path whose nearest
/// existing ancestor is not a folder.
pub fn check_output_dir(path: &Path, arg: &str) -> Result<()> {
    let shown = path.display();
    if let Ok(m) = std::fs::metadata(path) {
        if !m.is_dir() {
            return Err(RaceError::param(
                arg,
                format!("`{shown}` exists and is not a folder: give a folder or a new path"),
            ));
        }
        return Ok(());
    }
    let mut up = path.parent();
    while let Some(a) = up {
        if a.as_os_str().is_empty() {
            return Ok(());
        }
        if let Ok(m) = std::fs::metadata(a) {
            if m.is_dir() {
                return Ok(());
            }
            return Err(RaceError::param(
                arg,
                format!(
                    "`{shown}` cannot be created: `{}` is not a folder",
                    a.display()
                ),
            ));
        }
        up = a.parent();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write goes to a temporary file in the same folder and is renamed into place: a write
    /// that fails part-way leaves the old file whole and no temporary behind, and a good one
    /// replaces it and leaves no temporary either.
    #[test]
    fn writes_go_through_a_temporary_file_and_a_rename() {
        let dir = std::env::temp_dir().join(format!("racelab-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("o.npy");
        write_atomic(&path, b"old contents").unwrap();
        let mut seen_tmp = None;
        let failed = write_with(&path, |w| {
            std::io::Write::write_all(w, b"half of the new")?;
            std::io::Write::flush(w)?;
            // Mid-write: the target is untouched, the bytes are in a temporary beside it.
            let others: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .filter(|n| n != "o.npy")
                .collect();
            seen_tmp = others.first().cloned();
            assert_eq!(std::fs::read(&path).unwrap(), b"old contents");
            Err(std::io::Error::other("killed"))
        });
        assert!(failed.unwrap_err().to_string().contains("killed"));
        let tmp = seen_tmp.expect("a temporary file while writing");
        assert!(tmp.starts_with(".o.npy.tmp-"), "{tmp}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old contents");
        // A killed run's temporary (its process gone) is removed by the next write.
        let stale = dir.join(format!(".o.npy.tmp-{}-0", u32::MAX - 1));
        std::fs::write(&stale, b"half").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        if Path::new("/proc/self").exists() {
            assert!(!stale.exists(), "a dead process's temporary is left");
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "temporaries left behind");
        std::fs::remove_dir_all(&dir).ok();
    }
}
