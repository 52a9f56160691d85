//! One entry point for every operator on `[B, H, N, d]` inputs: validate, lift each
//! per-head reference estimator over batch × heads, and count empty rows.

use crate::backend::{Device, Heads, PlanesF32};
use crate::error::{RaceError, Result};
use crate::hashing::Planes;
use crate::params::{validate_beta, validate_gamma, validate_pl, Combine};
use crate::reference::{self, HeadOutput};
use crate::tensor::{check_nonzero_rows, check_qkv, AttnShape, Element, Mat, Tensor, TensorRef};
use ndarray::{ArrayD, ArrayView, Dimension, IxDyn};
use rayon::prelude::*;
use serde::Serialize;
use std::borrow::Cow;

/// The operators racelab computes side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Softmax,
    Angular,
    Hard,
    Soft,
    Linear,
    Performer,
}

impl std::str::FromStr for Method {
    type Err = RaceError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "softmax" => Method::Softmax,
            "angular" => Method::Angular,
            "hard" => Method::Hard,
            "soft" => Method::Soft,
            "linear" => Method::Linear,
            "performer" => Method::Performer,
            _ => {
                return Err(RaceError::param(
                    "method",
                    format!(
                        "`{s}` is not a method; use softmax|angular|hard|soft|linear|performer"
                    ),
                ))
            }
        })
    }
}

impl Method {
    pub fn name(&self) -> &'static str {
        match self {
            Method::Softmax => "softmax",
            Method::Angular => "angular",
            Method::Hard => "hard",
            Method::Soft => "soft",
            Method::Linear => "linear",
            Method::Performer => "performer",
        }
    }
    /// Whether the method hashes with planes.
    pub fn uses_planes(&self) -> bool {
        matches!(self, Method::Hard | Method::Soft)
    }
}

/// Options of one `attend` call; fields a method does not use are ignored.
#[derive(Debug, Clone)]
pub struct AttendOptions {
    pub method: Method,
    pub causal: bool,
    pub p: usize,
    pub l: usize,
    pub beta: f64,
    pub gamma: f64,
    pub seed: u64,
    pub combine: Combine,
    /// Softmax/Performer logit scale; `None` = `1/sqrt(d)`.
    pub scale: Option<f64>,
    /// Performer feature count m.
    pub features: usize,
    /// Planes to use instead of drawing them from `seed`.
    pub planes: Option<Planes>,
    /// Performer features `ω` (m × d) to use instead of drawing them from `seed`.
    pub omega: Option<Mat<f64>>,
    /// Memory budget in bytes (`None`: what the machine has available); work whose
    /// estimated buffers exceed it is refused before anything is allocated ([`crate::memory`]).
    pub max_memory: Option<u64>,
}

impl AttendOptions {
    /// The RACE parameters of these options.
    pub fn race_params(&self) -> crate::params::RaceParams {
        crate::params::RaceParams {
            p: self.planes.as_ref().map_or(self.p, |pl| pl.p),
            l: self.planes.as_ref().map_or(self.l, |pl| pl.l),
            beta: self.beta,
            combine: self.combine,
            causal: self.causal,
            seed: self.seed,
        }
    }

    /// What this call asks of `device`, for its memory check.
    pub fn work(&self, shape: &AttnShape, device: Device) -> crate::memory::Work {
        let hashing = self.method.uses_planes();
        crate::memory::Work {
            method: self.method.name(),
            kernels: device.kernels(),
            p: if hashing {
                self.planes.as_ref().map_or(self.p, |pl| pl.p)
            } else {
                0
            },
            l: if hashing {
                self.planes.as_ref().map_or(self.l, |pl| pl.l)
            } else {
                1
            },
            heads: shape.batch * shape.heads,
            n: shape.n,
            m: shape.m,
            d: shape.d,
            dv: shape.dv,
            map_features: match self.method {
                Method::Linear => shape.d,
                Method::Performer => self.omega.as_ref().map_or(self.features, |o| o.rows),
                _ => 0,
            },
            quadratic: matches!(self.method, Method::Softmax | Method::Angular),
            backward: false,
            causal: self.causal,
        }
    }
}

impl Default for AttendOptions {
    fn default() -> Self {
        AttendOptions {
            method: Method::Soft,
            causal: false,
            p: 2,
            l: 2,
            beta: crate::params::DEFAULT_BETA,
            gamma: 2.0,
            seed: 0,
            combine: Combine::Paper,
            scale: None,
            features: 256,
            planes: None,
            omega: None,
            max_memory: None,
        }
    }
}

/// Result of [`attend`]: O with V's leading dims (in the inputs' element type), the empty-row
/// count, and planes used.
#[derive(Debug, Clone)]
pub struct AttendResult<T = f64> {
    pub o: Tensor<T>,
    pub shape: AttnShape,
    /// Rows left 0: hard LSH's queries that collide with no key; for the other kernels, rows
    /// they flagged and could not recompute (see `recomputed`).
    pub empty_rows: usize,
    pub planes: Option<Planes>,
    /// Soft RACE on the CPU and CUDA kernels: the rows whose denominator f32 cannot hold,
    /// flagged by the kernel and recomputed exactly ([`crate::cpu::recompute`]).
    pub recomputed: crate::backend::Recomputed,
}

/// The backend for `device` (for CUDA, after checking that a device is there).
pub fn for_device(device: Device) -> Result<Box<dyn crate::backend::SoftRace>> {
    Ok(match device {
        Device::Reference => Box::new(crate::reference::ReferenceRace),
        Device::Cpu => Box::new(crate::cpu::CpuRace::detected()),
        Device::Cuda => {
            crate::cuda::ensure_device()?;
            Box::new(crate::cuda::CudaRace)
        }
    })
}

/// Validate the table counts, then refuse work whose buffers cannot fit ([`crate::memory`]),
/// before the planes or any buffer are allocated.
fn check_memory(opts: &AttendOptions, shape: &AttnShape, device: Device) -> Result<()> {
    if opts.method.uses_planes() && opts.planes.is_none() {
        validate_pl(opts.p, opts.l)?;
    }
    crate::memory::check(&opts.work(shape, device), opts.max_memory)
}

/// Validate options against the input shape and resolve the planes.
pub fn resolve_planes(opts: &AttendOptions, d: usize) -> Result<Option<Planes>> {
    if !opts.method.uses_planes() {
        return Ok(None);
    }
    match &opts.planes {
        Some(pl) => {
            if pl.d != d {
                return Err(RaceError::shape(
                    "planes",
                    format!("planes have d = {} but q/k have d = {d}", pl.d),
                ));
            }
            Ok(Some(pl.clone()))
        }
        None => {
            validate_pl(opts.p, opts.l)?;
            Ok(Some(Planes::gaussian(opts.l, opts.p, d, opts.seed)?))
        }
    }
}

/// The checks every device makes before anything is allocated: the shapes of `q`, `k`, `v`,
/// the method's own parameters (β, γ, the Performer's feature count, the logit scale) and,
/// for the angular methods, rows with a direction.
fn validate<T: Element>(
    q: &TensorRef<'_, T>,
    k: &TensorRef<'_, T>,
    v: &TensorRef<'_, T>,
    opts: &AttendOptions,
) -> Result<AttnShape> {
    let shape = check_qkv(q, k, v, opts.causal)?;
    match opts.method {
        Method::Soft => validate_beta(opts.beta)?,
        Method::Angular => validate_gamma(opts.gamma)?,
        Method::Performer if opts.features == 0 && opts.omega.is_none() => {
            return Err(RaceError::param(
                "features",
                "Performer needs m ≥ 1 random features; use --features 256, say",
            ))
        }
        _ => {}
    }
    if let Some(s) = opts.scale {
        if !(s.is_finite() && s > 0.0) {
            return Err(RaceError::param(
                "scale",
                format!("scale = {s}; use a finite value > 0 (default 1/sqrt(d))"),
            ));
        }
    }
    if matches!(opts.method, Method::Angular | Method::Hard) {
        for (h, (qm, km)) in q.heads("q")?.iter().zip(k.heads("k")?.iter()).enumerate() {
            check_nonzero_rows(&format!("q (head {h})"), *qm)?;
            check_nonzero_rows(&format!("k (head {h})"), *km)?;
        }
    }
    Ok(shape)
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
    let shape = validate(q, k, v, opts)?;
    check_memory(opts, &shape, Device::Reference)?;
    let planes = resolve_planes(opts, shape.d)?;
    let (qh, kh, vh) = (q.heads("q")?, k.heads("k")?, v.heads("v")?);
    let omega = match (&opts.omega, opts.method) {
        (_, m) if m != Method::Performer => None,
        (Some(w), _) if w.cols != shape.d => {
            return Err(RaceError::shape(
                "omega",
                format!(
                    "Performer features have d = {} but q/k have d = {}",
                    w.cols, shape.d
                ),
            ))
        }
        (Some(w), _) => Some(w.clone()),
        (None, _) => Some(reference::baselines::performer_omega(
            opts.features,
            shape.d,
            opts.seed,
        )),
    };
    let outs: Vec<HeadOutput> = (0..qh.len())
        .into_par_iter()
        .map(|h| {
            let (qm, km, vm) = (qh[h], kh[h], vh[h]);
            match opts.method {
                Method::Softmax => {
                    reference::softmax::softmax_attention(qm, km, vm, opts.scale, opts.causal)
                }
                Method::Angular => {
                    reference::angular::angular_attention(qm, km, vm, opts.gamma, opts.causal)
                }
                Method::Hard => {
                    reference::race::hard_lsh(qm, km, vm, planes.as_ref().unwrap(), opts.causal)
                }
                // Exact at any beta: the plain bucket sums underflow from beta ≈ 350.
                Method::Soft => reference::logdomain::soft_race_log(
                    qm,
                    km,
                    vm,
                    planes.as_ref().unwrap(),
                    opts.beta,
                    opts.causal,
                    opts.combine,
                ),
                Method::Linear => reference::baselines::linear_attention(qm, km, vm, opts.causal),
                Method::Performer => reference::baselines::performer_attention(
                    qm,
                    km,
                    vm,
                    omega.as_ref().unwrap(),
                    opts.scale,
                    opts.causal,
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
        let (q64, k64, v64) = (T::as_f64(q.data), T::as_f64(k.data), T::as_f64(v.data));
        let r = reference_in(
            &TensorRef::new("q", q.shape.clone(), &q64)?,
            &TensorRef::new("k", k.shape.clone(), &k64)?,
            &TensorRef::new("v", v.shape.clone(), &v64)?,
            opts,
        )?;
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
    let shape = validate(q, k, v, opts)?;
    if opts.combine != Combine::Paper && opts.method == Method::Soft {
        return Err(RaceError::param("combine", "the authors' combine rule exists in the reference backend only; use --device reference"));
    }
    check_memory(opts, &shape, device)?;
    let planes = resolve_planes(opts, shape.d)?;
    let hn = shape.batch * shape.heads;
    let (q32, k32, v32) = (T::as_f32(q.data), T::as_f32(k.data), T::as_f32(v.data));
    let (qh, kh, vh) = (
        Heads::new(hn, shape.n, shape.d, &q32),
        Heads::new(hn, shape.m, shape.d, &k32),
        Heads::new(hn, shape.m, shape.dv, &v32),
    );
    let p32 = planes.as_ref().map(PlanesF32::from_planes);
    let isa = cpu::detected_isa();
    let mut recomputed = crate::backend::Recomputed::default();
    let (o, empty_rows): (Vec<f32>, usize) = match (device, opts.method) {
        (_, Method::Soft) => {
            let f = for_device(device)?.forward(
                &opts.race_params(),
                p32.as_ref().expect("soft RACE has planes"),
                qh,
                kh,
                vh,
            )?;
            recomputed = f.recomputed;
            (f.o, f.empty_rows)
        }
        (Device::Cuda, m) => {
            return Err(RaceError::param(
                "device",
                format!(
                    "the CUDA backend runs soft RACE only, not `{}`; use --device cpu or reference",
                    m.name()
                ),
            ))
        }
        (_, Method::Hard) => {
            let f = cpu::token::forward(
                &cpu::HardMap {
                    planes: p32.as_ref().unwrap(),
                },
                qh,
                kh,
                vh,
                opts.causal,
                isa,
            );
            (f.o, f.empty_rows)
        }
        (_, Method::Linear) => {
            let f =
                cpu::token::forward(&cpu::LinearMap { d: shape.d }, qh, kh, vh, opts.causal, isa);
            (f.o, f.empty_rows)
        }
        (_, Method::Performer) => {
            let om = opts.omega.clone().unwrap_or_else(|| {
                reference::baselines::performer_omega(opts.features, shape.d, opts.seed)
            });
            if om.cols != shape.d {
                return Err(RaceError::shape(
                    "omega",
                    format!(
                        "Performer features have d = {} but q/k have d = {}",
                        om.cols, shape.d
                    ),
                ));
            }
            let scale = opts.scale.unwrap_or(1.0 / (shape.d as f64).sqrt()) as f32;
            let map = features::performer_map(
                om.data.iter().map(|&x| x as f32).collect(),
                om.rows,
                shape.d,
                scale,
                kh,
                isa,
            );
            let f = cpu::token::forward(&map, qh, kh, vh, opts.causal, isa);
            (f.o, f.empty_rows)
        }
        (_, Method::Softmax) => (
            exact::exact_attention(
                exact::Exact::Softmax {
                    scale: opts.scale.unwrap_or(1.0 / (shape.d as f64).sqrt()) as f32,
                },
                qh,
                kh,
                vh,
                opts.causal,
                isa,
            ),
            0,
        ),
        (_, Method::Angular) => (
            exact::exact_attention(
                exact::Exact::Angular {
                    gamma: opts.gamma as f32,
                },
                qh,
                kh,
                vh,
                opts.causal,
                isa,
            ),
            0,
        ),
    };
    let mut oshape = q.shape[..q.shape.len() - 1].to_vec();
    oshape.push(shape.dv);
    Ok(AttendResult {
        o: Tensor {
            shape: oshape,
            data: T::from_f32(o),
        },
        shape,
        empty_rows,
        planes,
        recomputed,
    })
}

/// The output of [`attend_array`]: `O` as an owned array with V's leading dims, and what the
/// call did besides.
#[derive(Debug, Clone)]
pub struct ArrayOutput<T> {
    pub o: ArrayD<T>,
    /// See [`AttendResult::empty_rows`].
    pub empty_rows: usize,
    /// See [`AttendResult::recomputed`].
    pub recomputed: crate::backend::Recomputed,
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

/// The elements of `a` in row-major order: borrowed when `a` is in standard layout, else
/// copied.
fn standard_rows<'a, T: Clone, D: Dimension>(a: &ArrayView<'a, T, D>) -> Cow<'a, [T]> {
    match a.clone().to_slice() {
        Some(s) => Cow::Borrowed(s),
        None => Cow::Owned(a.iter().cloned().collect()),
    }
}
