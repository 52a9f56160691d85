//! One fuzz input as calls of racelab's public entry points: `attend_array` on ndarray views of
//! any layout, the `Backend` contract (`CpuRace` at every instruction-set level, with
//! `Heads` and `PlanesF32` values a caller may build by hand) and `Planes`. Shared by
//! `fuzz/fuzz_targets/attend.rs` (the fuzzer) and `tests/fuzz_corpus.rs` (the corpus replayed
//! by `cargo test`). Every call must return an error or a result whose numbers are finite:
//! never a panic, an abort or a NaN. Sizes are capped here (tokens, widths, `L·2^P`) so that
//! one input runs in well under a millisecond to a few; past a cap the input is skipped.

use ndarray::{ArrayView, ShapeBuilder};
use racelab_core::backend::{Backend, Heads, PlanesF32};
use racelab_core::cpu::{CpuRace, Isa, Level};
use racelab_core::params::{Beta, Bits, Seed, Tables};
use racelab_core::{
    AttendOptions, Combine, Device, FeatureSpec, Method, PlaneSpec, Planes, RaceParams,
};

/// Tokens per head (queries and keys).
pub const MAX_N: usize = 40;
/// Widths of `q`/`k` and of `v`.
pub const MAX_D: usize = 24;
/// Heads.
pub const MAX_HEADS: usize = 3;
/// Features `L·2^P` of a hashing method.
pub const MAX_FEATURES: usize = 512;

/// What one input did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An entry point returned a result (checked finite).
    Ran,
    /// An entry point returned an error.
    Refused,
    /// Past a cap: nothing was called.
    Skipped,
}

/// The input read front to back; past its end every read is 0.
struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    /// True for one byte value in `k`.
    fn one_in(&mut self, k: u8) -> bool {
        self.u8().is_multiple_of(k)
    }
    /// Up to `max`, inclusive.
    fn upto(&mut self, max: usize) -> usize {
        self.u8() as usize % (max + 1)
    }
    /// A float: mostly small multiples of 1/16, sometimes any bit pattern (NaN, ±∞,
    /// subnormals, f32's largest).
    fn value(&mut self, raw: bool) -> f32 {
        if raw {
            f32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
        } else {
            (self.u8() as i8) as f32 / 16.0
        }
    }
    fn values(&mut self, len: usize, raw: bool) -> Vec<f32> {
        (0..len).map(|_| self.value(raw)).collect()
    }
    /// A parameter that is sometimes degenerate: 0, negative, NaN, ∞ or huge.
    fn param(&mut self) -> f64 {
        match self.u8() % 8 {
            0 => 0.0,
            1 => -1.0,
            2 => f64::NAN,
            3 => f64::INFINITY,
            4 => 1e300,
            _ => (self.u16() as f64 + 1.0) / 64.0,
        }
    }
}

/// Every number of `x` finite, or a panic naming `what`.
fn finite(what: &str, x: impl IntoIterator<Item = f64>) {
    for (i, v) in x.into_iter().enumerate() {
        assert!(v.is_finite(), "{what}: entry {i} is {v}");
    }
}

/// Run one input.
pub fn run(data: &[u8]) -> Outcome {
    let mut b = Bytes { data, at: 0 };
    match b.u8() % 3 {
        0 => arrays(&mut b),
        1 => contract(&mut b),
        _ => planes(&mut b),
    }
}

/// The method a selector byte names, with fuzzed parameters.
fn method(b: &mut Bytes, p: usize, l: usize) -> Option<Method> {
    let seed = b.u8() as u64;
    Some(match b.u8() % 8 {
        0 => Method::Softmax {
            scale: (b.one_in(2)).then(|| b.param()),
        },
        1 => Method::Angular { gamma: b.param() },
        2 => Method::Hard {
            planes: PlaneSpec::Draw { p, l, seed },
        },
        3 => Method::Linear,
        4 => Method::Performer {
            features: FeatureSpec::Draw {
                m: b.upto(32),
                seed,
            },
            scale: (b.one_in(2)).then(|| b.param()),
        },
        5 => Method::Soft {
            planes: PlaneSpec::Draw { p, l, seed },
            beta: b.param(),
            combine: if b.one_in(4) {
                Combine::Authors
            } else {
                Combine::Paper
            },
        },
        6 => Method::soft(Bits(p), Tables(l), Beta(b.param()), Seed(seed)),
        _ => {
            // Planes from a caller's data, which may be short or not finite (refused there).
            let d = b.upto(MAX_D);
            let len = if b.one_in(4) { b.upto(64) } else { l * p * d };
            let w = (0..len)
                .map(|_| {
                    let raw = b.one_in(8);
                    b.value(raw) as f64
                })
                .collect();
            let planes = Planes::from_data(Bits(p), Tables(l), d, w).ok()?;
            return Some(Method::Soft {
                planes: PlaneSpec::Given(planes),
                beta: b.param(),
                combine: Combine::Paper,
            });
        }
    })
}

/// `attend_array` on `[heads, n, d]` views: row-major, with the last two axes swapped, or
/// every other element of a larger buffer; `q`, `k` and `v` of fuzzed (possibly different)
/// shapes; f32 or f64; the CPU kernels or the reference.
fn arrays(b: &mut Bytes) -> Outcome {
    let (p, l) = (b.upto(12), b.upto(40));
    if l.saturating_mul(1usize.checked_shl(p as u32).unwrap_or(usize::MAX)) > MAX_FEATURES {
        return Outcome::Skipped;
    }
    let Some(m) = method(b, p, l) else {
        return Outcome::Refused;
    };
    let causal = b.u8() % 2 == 1;
    let device = if b.one_in(4) {
        Device::Reference
    } else {
        Device::Cpu
    };
    let raw = b.one_in(8);
    let heads = b.upto(MAX_HEADS);
    let shapes = [
        [heads, b.upto(MAX_N), b.upto(MAX_D)],
        [heads, b.upto(MAX_N), b.upto(MAX_D)],
        [heads, b.upto(MAX_N), b.upto(MAX_D)],
    ];
    let layout = b.u8() % 3;
    let bufs: Vec<Vec<f32>> = shapes
        .iter()
        .map(|s| b.values(2 * s.iter().product::<usize>(), raw))
        .collect();
    let views: Vec<ArrayView<'_, f32, ndarray::Ix3>> = shapes
        .iter()
        .zip(&bufs)
        .map(|(&[h, n, d], buf)| match layout {
            // (ndarray refuses custom strides on an empty view: those stay row-major.)
            _ if layout == 0 || h * n * d == 0 => {
                ArrayView::from_shape((h, n, d), &buf[..h * n * d]).unwrap()
            }
            1 => {
                let v = ArrayView::from_shape((h, d, n), &buf[..h * n * d]).unwrap();
                v.permuted_axes([0, 2, 1])
            }
            _ => ArrayView::from_shape((h, n, d).strides((2 * n * d, 2 * d, 2)), buf).unwrap(),
        })
        .collect();
    let opts = AttendOptions::new(m).causal(causal);
    let r = if b.one_in(2) {
        racelab_core::attend::attend_array(views[0], views[1], views[2], &opts, device)
            .map(|r| r.o.iter().map(|&x| x as f64).collect::<Vec<f64>>())
    } else {
        let wide: Vec<ndarray::Array3<f64>> = views.iter().map(|v| v.mapv(|x| x as f64)).collect();
        racelab_core::attend::attend_array(
            wide[0].view(),
            wide[1].view(),
            wide[2].view(),
            &opts,
            device,
        )
        .map(|r| r.o.iter().copied().collect())
    };
    match r {
        Ok(o) => {
            finite("attend_array o", o);
            Outcome::Ran
        }
        Err(_) => Outcome::Refused,
    }
}

/// The `Backend` contract on `CpuRace` at a fuzzed level, with `Heads` and `PlanesF32`
/// built as a caller can build them (`Heads::new`, `Planes::from_data`), with shapes that may
/// disagree with each other or with their data.
fn contract(b: &mut Bytes) -> Outcome {
    let level = [Level::Scalar, Level::Avx2, Level::Avx512][b.upto(2)];
    let race = CpuRace {
        isa: Isa::at_most(level),
    };
    let (p, l) = (b.upto(12), b.upto(40));
    let (pp, pl, pd) = if b.one_in(8) {
        (b.upto(12), b.upto(40), b.upto(MAX_D))
    } else {
        (p, l, usize::MAX)
    };
    let heads = b.upto(MAX_HEADS);
    let (n, m, d, dv) = (b.upto(MAX_N), b.upto(MAX_N), b.upto(MAX_D), b.upto(MAX_D));
    let pd = if pd == usize::MAX { d } else { pd };
    if pl.saturating_mul(1usize.checked_shl(pp as u32).unwrap_or(usize::MAX)) > MAX_FEATURES
        || l.saturating_mul(1usize.checked_shl(p as u32).unwrap_or(usize::MAX)) > MAX_FEATURES
    {
        return Outcome::Skipped;
    }
    let raw = b.one_in(8);
    let wlen = if b.one_in(8) {
        b.upto(64)
    } else {
        pl * pp * pd
    };
    // Planes whose shape may disagree with the parameters' or the inputs' (the planes'
    // own length is checked where they are made).
    let w = b.values(wlen, raw).into_iter().map(f64::from).collect();
    let planes = match Planes::from_data(Bits(pp), Tables(pl), pd, w) {
        Ok(x) => PlanesF32::from_planes(&x),
        Err(_) => return Outcome::Refused,
    };
    let params = match RaceParams::new(Bits(p), Tables(l), Beta(b.param())) {
        Ok(x) => x.with_causal(b.u8() % 2 == 1),
        Err(_) => return Outcome::Refused,
    };
    let params = match b.u8() % 16 {
        0 => params.with_combine(Combine::Authors),
        _ => params,
    };
    let lying = b.one_in(6);
    let (q, k, v, g) = (
        b.values(heads * n * d, raw),
        b.values(heads * m * d, raw),
        b.values(heads * m * dv, raw),
        b.values(heads * n * dv, raw),
    );
    let out = (|| {
        let qh = heads_of(b, lying, heads, n, d, &q)?;
        let kh = heads_of(b, lying, heads, m, d, &k)?;
        let vh = heads_of(b, lying, heads, m, dv, &v)?;
        let gh = heads_of(b, lying, heads, n, dv, &g)?;
        Some(if b.one_in(2) {
            race.forward(&params, &planes, qh, kh, vh)
                .map(|f| (f.o, Vec::new(), 0.0))
        } else {
            race.forward_backward(&params, &planes, qh, kh, vh, gh)
                .map(|(f, gr)| (f.o, [gr.dq, gr.dk, gr.dv].concat(), gr.dbeta))
        })
    })();
    match out {
        None => Outcome::Refused,
        Some(Ok((o, grads, dbeta))) => {
            finite("Backend o", o.iter().map(|&x| x as f64));
            finite("Backend gradients", grads.iter().map(|&x| x as f64));
            finite("Backend dbeta", [dbeta]);
            Outcome::Ran
        }
        Some(Err(_)) => Outcome::Refused,
    }
}

/// `[h, rows, cols]` over `x` through `Heads::new`, or (`lying`) with dimensions that may not
/// be its data's (refused there).
fn heads_of<'x>(
    b: &mut Bytes,
    lying: bool,
    h: usize,
    rows: usize,
    cols: usize,
    x: &'x [f32],
) -> Option<Heads<'x>> {
    if lying {
        let n = rows.wrapping_add(b.u8() as usize % 2 * (usize::MAX / 2));
        Heads::new(h + b.upto(1), n, cols, x).ok()
    } else {
        Heads::new(h, rows, cols, x).ok()
    }
}

/// `Planes`: drawn, from data, through f32 and back, checked against shapes.
fn planes(b: &mut Bytes) -> Outcome {
    let (l, p, d) = (b.u16() as usize % 4097, b.upto(70), b.u16() as usize % 4097);
    let seed = b.u8() as u64;
    let drawn = match b.u8() % 2 {
        0 => {
            // Past the caps only the refusal is asked for: a drawn size is checked first.
            if l.saturating_mul(p).saturating_mul(d) > 1 << 16 {
                let huge = Planes::gaussian(Bits(p), Tables(l << 40), d, Seed(seed));
                assert!(huge.is_err(), "planes of 2^40 tables were drawn");
                return Outcome::Refused;
            }
            Planes::gaussian(Bits(p), Tables(l), d, Seed(seed))
        }
        _ => {
            let len = if b.one_in(4) {
                b.upto(255)
            } else {
                l.saturating_mul(p).saturating_mul(d).min(1 << 12)
            };
            let w = (0..len)
                .map(|_| {
                    let raw = b.one_in(8);
                    b.value(raw) as f64
                })
                .collect();
            Planes::from_data(Bits(p), Tables(l), d, w)
        }
    };
    let Ok(planes) = drawn else {
        return Outcome::Refused;
    };
    let f = PlanesF32::from_planes(&planes);
    let back = f.to_planes();
    assert_eq!((back.l(), back.p(), back.d()), (l, p, d));
    let _ = planes.check(d, p, l);
    let _ = planes.check(d + 1, p, l);
    Outcome::Ran
}
