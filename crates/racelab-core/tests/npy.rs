//! `.npy` round trips (f32, f64, ranks 1–4) and Fortran-order reading.
use racelab_core::io::{npy_bytes, parse_npy, read_npy, write_npy, Dtype};

#[test]
fn round_trip_f32_and_f64_all_ranks() {
    let dir = std::env::temp_dir().join(format!("racelab-npy-{}", std::process::id()));
    for shape in [vec![5], vec![3, 4], vec![2, 3, 4], vec![2, 1, 3, 2]] {
        let n: usize = shape.iter().product();
        let data: Vec<f64> = (0..n).map(|i| (i as f64 - 3.5) * 0.37).collect();
        for dtype in [Dtype::F32, Dtype::F64] {
            let path = dir.join(format!("a{}_{:?}.npy", shape.len(), dtype));
            write_npy(&path, &shape, &data, dtype).unwrap();
            let back = read_npy(&path).unwrap();
            assert_eq!(back.dtype, dtype);
            assert_eq!(back.tensor.shape, shape);
            for (a, b) in back.tensor.data.iter().zip(&data) {
                let want = if dtype == Dtype::F32 {
                    *b as f32 as f64
                } else {
                    *b
                };
                assert_eq!(*a, want);
            }
            // Header is 64-byte aligned as the format requires.
            let bytes = std::fs::read(&path).unwrap();
            let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
            assert_eq!((10 + hlen) % 64, 0);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn fortran_order_is_transposed_on_read() {
    // C-order [[0,1,2],[3,4,5]] stored column-major is 0,3,1,4,2,5.
    let mut bytes = npy_bytes(&[2, 3], &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], Dtype::F64);
    let pos = bytes.windows(5).position(|w| w == b"False").unwrap();
    bytes[pos..pos + 5].copy_from_slice(b"True ");
    let arr = parse_npy(&bytes, "f.npy").unwrap();
    assert_eq!(arr.tensor.shape, vec![2, 3]);
    assert_eq!(arr.tensor.data, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn big_endian_is_read() {
    let mut bytes = npy_bytes(&[2], &[0.0, 0.0], Dtype::F64);
    let pos = bytes.windows(3).position(|w| w == b"<f8").unwrap();
    bytes[pos] = b'>';
    let n = bytes.len();
    bytes[n - 8..].copy_from_slice(&1.5f64.to_be_bytes());
    assert_eq!(
        parse_npy(&bytes, "be.npy").unwrap().tensor.data,
        vec![0.0, 1.5]
    );
}
