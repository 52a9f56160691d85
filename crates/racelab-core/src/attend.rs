//! One entry point for every operator on `[B, H, N, d]` inputs: validate, lift each
//! per-head reference estimator over batch × heads, and count empty rows.

#![deny(missing_docs)]

use crate::backend::{Device, Heads, PlanesF32};
use crate::error::{RaceError, Result};
use crate::hashing::Planes;
pub use crate::method::{FeatureSpec, Method, MethodKind, PlaneSpec};
use crate::params::Combine;
use crate::params::{Beta, Bits, Seed, Tables};
use crate::reference::{self, HeadOutput};
use crate::tensor::{standard_rows, AttnShape, Element, Mat, Tensor, TensorRef};
use ndarray::{ArrayD, ArrayView, Dimension, IxDyn};
use rayon::prelude::*;
use std::borrow::Cow;

/// Options of one `attend` call: the method with its own options, causal masking, and the
/// memory budget.
#[derive(Debug, Clone, PartialEq)]
pub struct AttendOptions {
    /// The operator, with its own options.
    pub method: Method,
    /// Each query sees the keys at or before it (Algorithm 2 for soft RACE).
    pub causal: bool,
    /// Memory budget in bytes (`None`: what the machine has available); work whose
    /// estimated buffers exceed it is refused before anything is allocated ([`crate::memory`]).
    pub max_memory: Option<u64>,
}

impl AttendOptions {
    /// `method`, not causal, no memory budget beyond the machine's.
    pub fn new(method: Method) -> Self {
        AttendOptions {
            method,
            causal: false,
            max_memory: None,
        }
    }

    /// The same options, causal or not.
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }

    /// What this call asks of `device`, for its memory check.
    pub fn work(&self, shape: &AttnShape, device: Device) -> crate::memory::Work {
        crate::validate::work(&self.method, shape, self.causal, false, device.kernels())
    }
}

impl Default for AttendOptions {
    /// Soft RACE at P = 2, L = 2, the default β, planes drawn from seed 0.
    fn default() -> Self {
        AttendOptions::new(Method::soft(
            Bits(2),
            Tables(2),
            Beta(crate::params::DEFAULT_BETA),
            Seed(0),
        ))
    }
}

/// Result of [`attend`]: O with V's leading dims (in the inputs' element type), the empty-row
/// count, and planes used.
#[derive(Debug, Clone)]
pub struct AttendResult<T = f64> {
    /// `O`, with `q`'s leading axes and `v`'s last.
    pub o: Tensor<T>,
    /// The validated shapes.
    pub shape: AttnShape,
    /// Rows left 0: hard LSH's queries that collide with no key; for the other kernels, rows
    /// they flagged and could not recompute (see `recomputed`).
    pub empty_rows: usize,
    /// The planes a hashing method used (drawn or given).
    pub planes: Option<Planes>,
    /// Soft RACE on the CPU and CUDA kernels: the rows whose denominator f32 cannot hold,
    /// flagged by the kernel and recomputed exactly ([`crate::shared::recompute`]).
    pub recomputed: crate::backend::Recomputed,
}

/// The backend for `device` (for CUDA, after checking that a device is there).
pub fn for_device(device: Device) -> Result<Box<dyn crate::backend::Backend>> {
    Ok(match device {
        Device::Reference => Box::new(crate::reference::ReferenceRace),
        Device::Cpu => Box::new(crate::cpu::CpuRace::detected()),
        Device::Cuda => {
            crate::cuda::ensure_device()?;
            Box::new(crate::cuda::CudaRace)
        }
    })
}

/// The one validation ([`crate::validate::check`]) of an `attend` call on `device`: every
/// buffer the call allocates is counted (f64 rows reach the f32 kernels as copies, f32 rows the
/// reference as f64 ones).
fn validate<T: Element>(
    q: &TensorRef<'_, T>,
    k: &TensorRef<'_, T>,
    v: &TensorRef<'_, T>,
    opts: &AttendOptions,
    device: Device,
) -> Result<crate::validate::Checked> {
    crate::validate::check(crate::validate::Call {
        method: &opts.method,
        causal: opts.causal,
        q,
        k,
        v,
        g: None,
        kernels: device.kernels(),
        budget: crate::validate::Budget {
            max_memory: opts.max_memory,
            held: crate::validate::Held::Nothing,
        },
    })
}

/// The planes of a hashing method for inputs of dimension `d` (drawn, or the given ones).
pub fn resolve_planes(method: &Method, d: usize) -> Result<Option<Planes>> {
    method.planes().map(|p| p.resolve(d)).transpose()
}

/// Run one operator (f64 reference) on `[N,d]`, `[H,N,d]` or `[B,H,N,d]` inputs.
pub fn attend(
    q: &Tensor<f64>,
    k: &Tensor<f64>,
    v: &Tensor<f64>,
    opts: &AttendOptions,
) -> Result<AttendResult> {
    reference_in(&q.view(), &k.view(), &v.view(), opts)
}

/// [`attend`] on borrowed f64 rows.
fn reference_in(
    q: &TensorRef<'_, f64>,
    k: &TensorRef<'_, f64>,
    v: &TensorRef<'_, f64>,
    opts: &AttendOptions,
) -> Result<AttendResult> {
    let shape = validate(q, k, v, opts, Device::Reference)?.shape;
    let planes = resolve_planes(&opts.method, shape.d)?;
    let omega = match &opts.method {
        Method::Performer { features, .. } => Some(features.resolve(shape.d)?),
        _ => None,
    };
    let (qh, kh, vh) = (q.heads("q")?, k.heads("k")?, v.heads("v")?);
    let causal = opts.causal;
    let outs: Vec<HeadOutput> = (0..qh.len())
        .into_par_iter()
        .map(|h| {
            let (qm, km, vm) = (qh[h], kh[h], vh[h]);
            let planes = || planes.as_ref().expect("a hashing method has planes");
            match &opts.method {
                Method::Softmax { scale } => {
                    reference::softmax::softmax_attention(qm, km, vm, *scale, causal)
                }
                Method::Angular { gamma } => {
                    reference::angular::angular_attention(qm, km, vm, *gamma, causal)
                }
                Method::Hard { .. } => reference::race::hard_lsh(qm, km, vm, planes(), causal),
                // Exact at any beta: the plain bucket sums underflow from beta ≈ 350.
                Method::Soft { beta, combine, .. } => reference::logdomain::soft_race_log(
                    qm,
                    km,
                    vm,
                    planes(),
                    *beta,
                    causal,
                    *combine,
                ),
                Method::Linear => reference::baselines::linear_attention(qm, km, vm, causal),
                Method::Performer { scale, .. } => reference::baselines::performer_attention(
                    qm,
                    km,
                    vm,
                    omega.as_ref().expect("Performer has features"),
                    *scale,
                    causal,
                ),
            }
        })
        .collect();
    let empty_rows = outs.iter().map(|o| o.empty_rows).sum();
    let lead = &q.shape[..q.shape.len() - 2];
    let o = Tensor::stack_heads(
        lead,
        outs.into_iter().map(|h| h.o).collect::<Vec<Mat<f64>>>(),
    );
    Ok(AttendResult {
        o,
        shape,
        empty_rows,
        planes,
        recomputed: Default::default(),
    })
}

/// Run one operator with the chosen backend on f64 inputs. `Reference` is [`attend`]; `Cpu`
/// and `Cuda` compute in f32 (inputs rounded to f32) on the same planes / features.
pub fn attend_with(
    q: &Tensor<f64>,
    k: &Tensor<f64>,
    v: &Tensor<f64>,
    opts: &AttendOptions,
    device: Device,
) -> Result<AttendResult> {
    attend_in(&q.view(), &k.view(), &v.view(), opts, device)
}

/// Run one operator with the chosen backend on borrowed rows of either element type, the
/// output in the same type. f32 rows reach the f32 kernels (`Cpu`, `Cuda`) as they are, with
/// no f64 copy; the reference widens them to f64 (exactly) and rounds its output back. f64
/// rows are rounded to f32 for the kernels.
pub fn attend_in<T: Element>(
    q: &TensorRef<'_, T>,
    k: &TensorRef<'_, T>,
    v: &TensorRef<'_, T>,
    opts: &AttendOptions,
    device: Device,
) -> Result<AttendResult<T>> {
    use crate::cpu::{self, exact, features};
    if device == Device::Reference {
        let r = widened_reference([q, k, v], opts)?;
        return Ok(AttendResult {
            o: Tensor {
                shape: r.o.shape,
                data: T::from_f64(r.o.data),
            },
            shape: r.shape,
            empty_rows: r.empty_rows,
            planes: r.planes,
            recomputed: r.recomputed,
        });
    }
    let checked = validate(q, k, v, opts, device)?;
    let shape = checked.shape;
    let planes = resolve_planes(&opts.method, shape.d)?;
    let hn = shape.batch * shape.heads;
    // Values far below 1 are scaled up by a power of two (exactly) for the f32 kernels and
    // the output scaled back in f64: their weighted sums would otherwise be subnormal in
    // f32 and keep few digits (1e-40 holds 2^-149 only to 1.4e-5 of itself).
    let vscale = tiny_value_scale(checked.vmax);
    let (q32, k32) = (T::as_f32(q.data), T::as_f32(k.data));
    let v32: std::borrow::Cow<'_, [f32]> = match vscale {
        None => T::as_f32(v.data),
        Some(s) => T::as_f64(v.data).iter().map(|&x| (x * s) as f32).collect(),
    };
    let (qh, kh, vh) = (
        Heads::of(hn, shape.n, shape.d, &q32),
        Heads::of(hn, shape.m, shape.d, &k32),
        Heads::of(hn, shape.m, shape.dv, &v32),
    );
    let p32 = planes.as_ref().map(PlanesF32::from_planes);
    let p32 = || p32.as_ref().expect("a hashing method has planes");
    let (isa, causal) = (cpu::detected_isa(), opts.causal);
    let default_scale = 1.0 / (shape.d as f64).sqrt();
    let mut recomputed = crate::backend::Recomputed::default();
    let (o, empty_rows): (Vec<f32>, usize) = match (device, &opts.method) {
        (_, Method::Soft { combine, .. }) => {
            if *combine != Combine::Paper {
                return Err(RaceError::param(
                    "combine",
                    format!(
                        "the authors' combine rule exists in the reference backend only; use {}",
                        crate::error::setting("device", "reference")
                    ),
                ));
            }
            let params = opts.method.race_params(causal).expect("soft RACE");
            // Validated above (`validate`, the same checks): not scanned a second time.
            let pb = crate::backend::Problem::validated(&params, p32(), [qh, kh, vh]);
            let mut o = vec![0.0f32; pb.output_len()];
            let saved = for_device(device)?.forward_into(&pb, &mut o, Default::default())?;
            recomputed = saved.recomputed;
            (o, saved.empty_rows)
        }
        (Device::Cuda, m) => {
            return Err(RaceError::param(
                "device",
                format!(
                    "the CUDA backend runs soft RACE only, not `{}`; use {} or {}",
                    m.name(),
                    crate::error::setting("device", "cpu"),
                    crate::error::setting("device", "reference")
                ),
            ))
        }
        (_, Method::Hard { .. }) => {
            let map = cpu::HardMap { planes: p32() };
            let f = cpu::token::forward(&map, qh, kh, vh, causal, isa);
            (f.o, f.empty_rows)
        }
        (_, Method::Linear) => {
            let f = cpu::token::forward(&cpu::LinearMap { d: shape.d }, qh, kh, vh, causal, isa);
            finish_flagged(f, [q, k, v], opts, vscale.unwrap_or(1.0), &mut recomputed)?
        }
        (_, Method::Performer { features, scale }) => {
            let om = features.resolve(shape.d)?;
            let map = features::performer_map(
                om.data.iter().map(|&x| x as f32).collect(),
                om.rows,
                shape.d,
                scale.unwrap_or(default_scale) as f32,
                kh,
                isa,
            );
            let f = cpu::token::forward(&map, qh, kh, vh, causal, isa);
            finish_flagged(f, [q, k, v], opts, vscale.unwrap_or(1.0), &mut recomputed)?
        }
        (_, Method::Softmax { scale }) => {
            let scale = scale.unwrap_or(default_scale) as f32;
            let o =
                exact::exact_attention(exact::Exact::Softmax { scale }, qh, kh, vh, causal, isa);
            (o, 0)
        }
        (_, Method::Angular { gamma }) => {
            let gamma = *gamma as f32;
            let o =
                exact::exact_attention(exact::Exact::Angular { gamma }, qh, kh, vh, causal, isa);
            (o, 0)
        }
    };
    let mut oshape = q.shape[..q.shape.len() - 1].to_vec();
    oshape.push(shape.dv);
    let data = match vscale {
        None => T::from_f32(o),
        Some(s) => T::from_f64(o.iter().map(|&x| x as f64 / s).collect()),
    };
    Ok(AttendResult {
        o: Tensor {
            shape: oshape,
            data,
        },
        shape,
        empty_rows,
        planes,
        recomputed,
    })
}

/// The f64 reference on rows of either type, widened (exactly) to f64.
fn widened_reference<T: Element>(
    [q, k, v]: [&TensorRef<'_, T>; 3],
    opts: &AttendOptions,
) -> Result<AttendResult> {
    let (q64, k64, v64) = (T::as_f64(q.data), T::as_f64(k.data), T::as_f64(v.data));
    reference_in(
        &TensorRef::new("q", q.shape.clone(), &q64)?,
        &TensorRef::new("k", k.shape.clone(), &k64)?,
        &TensorRef::new("v", v.shape.clone(), &v64)?,
        opts,
    )
}

/// The power of two that brings values whose largest magnitude is `vmax` up to about 1, when
/// `vmax` is below 2^-64 (products of kernel weights with such values approach f32's
/// subnormals); `None` otherwise (and for all-zero values).
fn tiny_value_scale(vmax: f64) -> Option<f64> {
    (vmax > 0.0 && vmax < 2f64.powi(-64)).then(|| 2f64.powi(-(vmax.log2().floor() as i32)))
}

/// The rows the linear and Performer kernels flagged (a denominator f32 cannot hold: features
/// that underflow, as `e^x` of a row of large negative entries does) recomputed by the f64
/// reference ([`attend`]) on the same inputs; the other rows are the kernel's (on values
/// scaled by `vscale`, as the recomputed rows are). Returns the output and the rows the
/// reference leaves empty too.
fn finish_flagged<T: Element>(
    f: crate::cpu::ForwardOut,
    [q, k, v]: [&TensorRef<'_, T>; 3],
    opts: &AttendOptions,
    vscale: f64,
    recomputed: &mut crate::backend::Recomputed,
) -> Result<(Vec<f32>, usize)> {
    if f.empty_rows == 0 {
        return Ok((f.o, 0));
    }
    let t0 = std::time::Instant::now();
    let rows = crate::shared::recompute::flagged(&f.ctx.den);
    let r = widened_reference([q, k, v], opts)?;
    let dv = r.shape.dv;
    let mut o = f.o;
    for &i in &rows {
        for (x, &y) in o[i * dv..(i + 1) * dv].iter_mut().zip(&r.o.data[i * dv..]) {
            *x = (y * vscale) as f32;
        }
    }
    *recomputed = crate::backend::Recomputed {
        rows,
        seconds: t0.elapsed().as_secs_f64(),
    };
    Ok((o, r.empty_rows))
}

/// The output of [`attend_array`]: `O` as an owned array with V's leading dims, and what the
/// call did besides.
#[derive(Debug, Clone)]
pub struct ArrayOutput<T> {
    /// `O`, with `q`'s leading axes and `v`'s last.
    pub o: ArrayD<T>,
    /// See [`AttendResult::empty_rows`].
    pub empty_rows: usize,
    /// See [`AttendResult::recomputed`].
    pub recomputed: crate::backend::Recomputed,
    /// The planes a hashing method used (drawn or given).
    pub planes: Option<Planes>,
    /// Which of `q`, `k`, `v` were copied: a view in standard (row-major, contiguous) layout
    /// is read where it lies; any other layout (transposed, sliced with steps, permuted axes)
    /// is copied once into row-major order.
    pub copied: [bool; 3],
}

/// [`attend_in`] on ndarray views `[N, d]`, `[H, N, d]` or `[B, H, N, d]` (f32 or f64; any
/// layout, see [`ArrayOutput::copied`]). f32 views reach the f32 kernels without an f64 copy.
pub fn attend_array<T: Element, D: Dimension>(
    q: ArrayView<'_, T, D>,
    k: ArrayView<'_, T, D>,
    v: ArrayView<'_, T, D>,
    opts: &AttendOptions,
    device: Device,
) -> Result<ArrayOutput<T>> {
    let (qr, kr, vr) = (standard_rows(&q), standard_rows(&k), standard_rows(&v));
    let copied = [&qr, &kr, &vr].map(|c| matches!(c, Cow::Owned(_)));
    let r = attend_in(
        &TensorRef::new("q", q.shape().to_vec(), &qr)?,
        &TensorRef::new("k", k.shape().to_vec(), &kr)?,
        &TensorRef::new("v", v.shape().to_vec(), &vr)?,
        opts,
        device,
    )?;
    let o = ArrayD::from_shape_vec(IxDyn(&r.o.shape), r.o.data)
        .map_err(|e| RaceError::shape("o", e.to_string()))?;
    Ok(ArrayOutput {
        o,
        empty_rows: r.empty_rows,
        recomputed: r.recomputed,
        planes: r.planes,
        copied,
    })
}

/// Tokens (queries and keys, one head) of the probe [`predict_exact_seconds`] times.
pub const PROBE_TOKENS: usize = 256;

/// The seconds exact softmax or angular attention (`method`) would take on `shape` on
/// `device`, predicted from a timed probe of the same kernel: [`PROBE_TOKENS`] seeded queries
/// and keys of the same widths on one head, the faster of two runs, scaled by `N·M` over the
/// probe's and by the heads (the reference runs heads in parallel, one per thread; the CPU
/// kernels spread each head over every thread). 0 for the linear-time methods.
pub fn predict_exact_seconds(
    method: &Method,
    shape: &AttnShape,
    causal: bool,
    device: Device,
) -> Result<f64> {
    if !method.kind().quadratic() || device == Device::Cuda {
        return Ok(0.0);
    }
    let t = PROBE_TOKENS;
    let mut rng = crate::rng::SeededRng::new(0, crate::rng::stream::PERFORMER);
    let q = Tensor::new(vec![t, shape.d], rng.normals(t * shape.d))?;
    let v = Tensor::new(vec![t, shape.dv], rng.normals(t * shape.dv))?;
    let opts = AttendOptions::new(method.clone()).causal(causal);
    let mut best = f64::INFINITY;
    for _ in 0..2 {
        let t0 = std::time::Instant::now();
        std::hint::black_box(attend_with(&q, &q, &v, &opts, device)?);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let threads = rayon::current_num_threads().max(1) as f64;
    let heads = (shape.batch * shape.heads) as f64;
    let rounds = match device {
        Device::Reference => (heads / threads).ceil(),
        _ => heads,
    };
    Ok(best * rounds * (shape.n as f64 * shape.m as f64) / (t * t) as f64)
}

/// Seconds as `42 s`, `3.5 min` or `2.1 h`.
pub fn human_seconds(s: f64) -> String {
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}
