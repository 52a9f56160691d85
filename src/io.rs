//! `.npy` input and output (format versions 1.0, 2.0 and 3.0).
//!
//! Reads little- or big-endian `f4`/`f8` arrays in C or Fortran order (Fortran data is
//! transposed to row-major on load) and returns `f64`; writes little-endian `f4` or `f8` in C
//! order, version 1.0. Anything else (other dtypes, truncated data, a broken header) is a
//! [`RaceError::Npy`] naming the file and what is wrong.

use crate::error::{RaceError, Result};
use crate::tensor::Tensor;
use std::path::Path;

const MAGIC: &[u8] = b"\x93NUMPY";

/// Element type of an array on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
}

/// An array read from `.npy`, converted to f64, with its on-disk dtype.
#[derive(Debug, Clone)]
pub struct NpyArray {
    pub tensor: Tensor<f64>,
    pub dtype: Dtype,
}

fn bad(path: &str, msg: impl Into<String>) -> RaceError {
    RaceError::Npy {
        path: path.to_string(),
        msg: msg.into(),
    }
}

/// Read an `.npy` file.
pub fn read_npy(path: &Path) -> Result<NpyArray> {
    let bytes = std::fs::read(path).map_err(|e| RaceError::io(path, e))?;
    parse_npy(&bytes, &path.display().to_string())
}

/// Parse `.npy` bytes; `name` is used in error messages.
pub fn parse_npy(bytes: &[u8], name: &str) -> Result<NpyArray> {
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
    let count: usize = shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| bad(name, "shape overflows"))?;
    let width = if dtype == Dtype::F32 { 4 } else { 8 };
    let body = &bytes[start + hlen..];
    if body.len() < count * width {
        return Err(bad(
            name,
            format!(
                "truncated data: shape {:?} needs {} bytes, file has {}",
                shape,
                count * width,
                body.len()
            ),
        ));
    }
    if body.len() > count * width {
        return Err(bad(
            name,
            format!(
                "{} trailing bytes after the data of shape {:?}",
                body.len() - count * width,
                shape
            ),
        ));
    }
    let mut data: Vec<f64> = Vec::with_capacity(count);
    for chunk in body.chunks_exact(width) {
        let x = match (dtype, big_endian) {
            (Dtype::F32, false) => f32::from_le_bytes(chunk.try_into().unwrap()) as f64,
            (Dtype::F32, true) => f32::from_be_bytes(chunk.try_into().unwrap()) as f64,
            (Dtype::F64, false) => f64::from_le_bytes(chunk.try_into().unwrap()),
            (Dtype::F64, true) => f64::from_be_bytes(chunk.try_into().unwrap()),
        };
        data.push(x);
    }
    if fortran && shape.len() > 1 {
        data = fortran_to_c(&data, &shape);
    }
    Ok(NpyArray {
        tensor: Tensor { shape, data },
        dtype,
    })
}

/// Reorder column-major data of `shape` into row-major.
fn fortran_to_c(data: &[f64], shape: &[usize]) -> Vec<f64> {
    let n = data.len();
    let mut out = vec![0.0; n];
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
pub fn npy_bytes(shape: &[usize], data: &[f64], dtype: Dtype) -> Vec<u8> {
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
        match dtype {
            Dtype::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            Dtype::F64 => out.extend_from_slice(&x.to_le_bytes()),
        }
    }
    out
}

/// Write an array to an `.npy` file.
pub fn write_npy(path: &Path, shape: &[usize], data: &[f64], dtype: Dtype) -> Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent).map_err(|e| RaceError::io(parent, e))?;
        }
    }
    std::fs::write(path, npy_bytes(shape, data, dtype)).map_err(|e| RaceError::io(path, e))
}

/// Read planes of shape `[L, P, d]`.
pub fn read_planes(path: &Path) -> Result<crate::hashing::Planes> {
    let arr = read_npy(path)?;
    match arr.tensor.shape.as_slice() {
        [l, p, d] => crate::hashing::Planes::from_data(*l, *p, *d, arr.tensor.data),
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
