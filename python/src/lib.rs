//! `racelab._racelab`: the Python bindings over racelab's library.
//!
//! - `planes`: the hash planes the command line draws (`[L, P, d]`, f64);
//! - `attend`: any operator on any device, as `racelab attend` runs it (f64 in, f64 out);
//! - `soft_forward` / `soft_backward`: the production f32 CPU kernels, the forward keeping
//!   its saved values (`Saved`) for the backward, as a `torch.autograd.Function` needs them;
//! - `soft_forward_f64` / `soft_backward_f64`: the f64 log-domain reference (exact at any
//!   β), for float64 tensors and `gradcheck`.
//!
//! Every function validates through the library (the command line's checks and messages), and
//! an error becomes `ValueError` with that message. The GIL is released while kernels run.
//! Inputs are C-contiguous `[heads, n, cols]` arrays; the Python layer reshapes and copies.

use numpy::{
    PyArray1, PyArrayMethods, PyReadonlyArray3, PyReadonlyArrayDyn, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use racelab_core::attend::{attend_with, AttendOptions};
use racelab_core::backend::{
    Backend, Device, GradsMut, Heads, PlanesF32, Problem, RaceParams, Saved as Kept,
};
use racelab_core::cpu::ABuf;
use racelab_core::cpu::CpuRace;
use racelab_core::error::Spelling;
use racelab_core::hashing::Planes;
use racelab_core::method::{Flags, MethodKind};
use racelab_core::params::Combine;
use racelab_core::params::{Beta, Bits, Seed, Tables};
use racelab_core::reference::logdomain::{soft_race_backward_log, soft_race_log};
use racelab_core::tensor::{check_qkv, Mat, MatRef, Tensor};
use racelab_core::validate::{Budget, Held};
use racelab_core::RaceError;
use rayon::prelude::*;

/// A library error as Python's `ValueError`, its message in Python's words (the module sets
/// [`Spelling::Python`] when it loads: `max_memory=`, `device="reference"`).
fn py_err(e: RaceError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The elements of a C-contiguous array, or a `ValueError` naming it.
fn contiguous<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    name: &str,
    a: &'a numpy::PyReadonlyArray<'_, T, D>,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| {
        PyValueError::new_err(format!(
            "shape error in `{name}`: the array is not C-contiguous; pass np.ascontiguousarray({name})"
        ))
    })
}

/// `[heads, n, cols]` of a C-contiguous array.
fn slice3<'a, T: numpy::Element>(
    name: &str,
    a: &'a PyReadonlyArray3<'_, T>,
) -> PyResult<(&'a [T], [usize; 3])> {
    let s = a.shape();
    Ok((contiguous(name, a)?, [s[0], s[1], s[2]]))
}

fn heads<'a>(x: (&'a [f32], [usize; 3])) -> PyResult<Heads<'a>> {
    Heads::new(x.1[0], x.1[1], x.1[2], x.0).map_err(py_err)
}

/// A kernel's output memory, owned by the numpy array that shows it: 64-byte aligned and on
/// transparent huge pages ([`ABuf`]), as the kernels' own buffers are. (A `Vec` handed to
/// numpy starts 16 bytes into a page, and the kernels' full-vector stores and loads then
/// split cache lines.)
#[pyclass(module = "racelab._racelab", frozen)]
struct Buffer(Option<ABuf>);

/// Output buffers of arrays that Python has freed, reused for outputs of the same length (a
/// caching allocator, as PyTorch's own is: a training step then pays no page faults or
/// zeroing for its outputs). At most [`CACHE_MAX`] buffers are kept; [`empty_cache`] frees
/// them, and a memory refusal empties the cache and checks again.
static CACHE: std::sync::Mutex<Vec<ABuf>> = std::sync::Mutex::new(Vec::new());
const CACHE_MAX: usize = 8;

impl Drop for Buffer {
    fn drop(&mut self) {
        if let (Some(buf), Ok(mut cache)) = (self.0.take(), CACHE.lock()) {
            if cache.len() < CACHE_MAX {
                cache.push(buf);
            }
        }
    }
}

/// A buffer of `len` floats: a cached one of that length, else a fresh zeroed one. The
/// kernels overwrite every entry of their outputs.
fn output(len: usize) -> ABuf {
    let cached = CACHE.lock().ok().and_then(|mut c| {
        let i = c.iter().position(|b| b.len() == len)?;
        Some(c.swap_remove(i))
    });
    cached.unwrap_or_else(|| ABuf::zeroed(len))
}

/// Free the cached output buffers and the recycled contexts.
#[pyfunction]
fn empty_cache() {
    if let Ok(mut c) = CACHE.lock() {
        c.clear();
    }
    if let Ok(mut p) = POOL.lock() {
        p.clear();
    }
}

/// The validated problem ([`Problem::within`]: the one validation), its memory check counting
/// only what this call allocates (`held`: the inputs, and in a backward the forward's output and
/// saved values, are already in memory). When the work does not fit, the caches are emptied
/// and it is checked once more: cached buffers are memory the new work can have.
fn problem<'a>(
    params: &RaceParams,
    planes: &'a PlanesF32,
    qkv: [Heads<'a>; 3],
    g: Option<Heads<'a>>,
    held: Held,
) -> PyResult<Problem<'a>> {
    let budget = Budget::holding(held);
    match Problem::within(params, planes, qkv, g, budget) {
        Err(RaceError::TooLarge(_)) => {
            empty_cache();
            Problem::within(params, planes, qkv, g, budget).map_err(py_err)
        }
        r => r.map_err(py_err),
    }
}

/// A `[dims…]` f32 array over an aligned kernel buffer (no copy).
fn aligned<'py>(py: Python<'py>, buf: ABuf, dims: &[usize]) -> PyResult<Bound<'py, PyAny>> {
    let (len, ptr) = (buf.len(), buf.as_ptr());
    let owner = Bound::new(py, Buffer(Some(buf)))?;
    // SAFETY: the view covers the buffer `owner` keeps alive for as long as the array lives,
    // and nothing else refers to that memory once the kernel that wrote it has returned.
    let flat = unsafe {
        let view = numpy::ndarray::ArrayView1::from_shape_ptr(len, ptr);
        PyArray1::<f32>::borrow_from_array(&view, owner.into_any())
    };
    Ok(flat.reshape(dims.to_vec())?.into_any())
}

/// A `[dims…]` f32/f64 array owning `data` (no copy).
fn array<'py, T: numpy::Element>(
    py: Python<'py>,
    data: Vec<T>,
    dims: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    Ok(PyArray1::from_vec(py, data)
        .reshape(dims.to_vec())?
        .into_any())
}

/// An f64 tensor copied from a C-contiguous array, or a `ValueError` naming it.
fn tensor(name: &str, a: &PyReadonlyArrayDyn<'_, f64>) -> PyResult<Tensor<f64>> {
    Tensor::new(a.shape().to_vec(), contiguous(name, a)?.to_vec()).map_err(py_err)
}

/// Planes from a `[L, P, d]` f64 array, checked.
fn planes_of(w: &PyReadonlyArray3<'_, f64>) -> PyResult<Planes> {
    let (data, [l, p, d]) = slice3("planes", w)?;
    Planes::from_data(Bits(p), Tables(l), d, data.to_vec()).map_err(py_err)
}

/// The planes `racelab` draws for `(L, P, d, seed)`: `[L, P, d]` standard normal, f64.
#[pyfunction]
fn planes<'py>(
    py: Python<'py>,
    l: usize,
    p: usize,
    d: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyAny>> {
    racelab_core::params::validate_pl(p, l).map_err(py_err)?;
    let w = Planes::gaussian(Bits(p), Tables(l), d, Seed(seed)).map_err(py_err)?;
    array(py, w.w().to_vec(), &[l, p, d])
}

/// One operator on `[N,d]`, `[H,N,d]` or `[B,H,N,d]` inputs (f64; the Python layer converts),
/// as `racelab attend` runs it. Returns `(o, shape of o, empty rows, recomputed rows)`.
// One argument per keyword of the Python call (`racelab.attend(q, k, v, method=…, …)`).
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (q, k, v, method, p, l, beta, causal, planes, combine, device, seed, gamma, scale, features, max_memory))]
fn attend<'py>(
    py: Python<'py>,
    q: PyReadonlyArrayDyn<'py, f64>,
    k: PyReadonlyArrayDyn<'py, f64>,
    v: PyReadonlyArrayDyn<'py, f64>,
    method: &str,
    p: usize,
    l: usize,
    beta: f64,
    causal: bool,
    planes: Option<PyReadonlyArray3<'py, f64>>,
    combine: &str,
    device: &str,
    seed: u64,
    gamma: f64,
    scale: Option<f64>,
    features: usize,
    max_memory: Option<u64>,
) -> PyResult<(Bound<'py, PyAny>, usize, usize)> {
    let method: MethodKind = method.parse().map_err(py_err)?;
    let device: Device = device.parse().map_err(py_err)?;
    let combine: Combine = combine.parse().map_err(py_err)?;
    let planes = planes.as_ref().map(planes_of).transpose()?;
    let (q, k, v) = (tensor("q", &q)?, tensor("k", &k)?, tensor("v", &v)?);
    let flags = Flags {
        p,
        l,
        beta,
        combine,
        gamma,
        scale,
        features,
        planes,
        seed,
    };
    let opts = AttendOptions {
        method: method.with(&flags),
        causal,
        max_memory,
    };
    let res = py
        .detach(|| attend_with(&q, &k, &v, &opts, device))
        .map_err(py_err)?;
    let shape = res.o.shape.clone();
    Ok((
        array(py, res.o.data, &shape)?,
        res.empty_rows,
        res.recomputed.rows.len(),
    ))
}

/// What the f32 forward keeps for its backward: the kernels' context (denominators, `tanh`
/// projections, chunk states), the planes and β it ran with.
#[pyclass(module = "racelab._racelab", frozen)]
struct Saved {
    kept: Kept,
    planes: PlanesF32,
    params: RaceParams,
}

/// What finished steps saved, recycled by the next forward: a training loop then pays fresh
/// pages for the per-token saved values once, not every step.
static POOL: std::sync::Mutex<Vec<Kept>> = std::sync::Mutex::new(Vec::new());
/// Saved states kept for reuse at most (one per forward in flight in a typical model).
const POOL_MAX: usize = 8;

impl Drop for Saved {
    fn drop(&mut self) {
        if let Ok(mut pool) = POOL.lock() {
            if pool.len() < POOL_MAX {
                pool.push(std::mem::take(&mut self.kept));
            }
        }
    }
}

fn pooled() -> Kept {
    POOL.lock()
        .ok()
        .and_then(|mut p| p.pop())
        .unwrap_or_default()
}

fn params(planes: &PlanesF32, beta: f64, causal: bool) -> PyResult<RaceParams> {
    Ok(
        RaceParams::new(Bits(planes.p()), Tables(planes.l()), Beta(beta))
            .map_err(py_err)?
            .with_causal(causal),
    )
}

/// Production f32 soft-RACE forward on `[heads, n, ·]` arrays and `[L, P, d]` planes (rounded
/// to f32), through the backend contract ([`Backend::forward_into`] of [`CpuRace`]). Returns
/// `(o [heads, n, dv], saved)`.
#[pyfunction]
fn soft_forward<'py>(
    py: Python<'py>,
    q: PyReadonlyArray3<'py, f32>,
    k: PyReadonlyArray3<'py, f32>,
    v: PyReadonlyArray3<'py, f32>,
    planes: PyReadonlyArray3<'py, f64>,
    beta: f64,
    causal: bool,
) -> PyResult<(Bound<'py, PyAny>, Saved)> {
    let planes = PlanesF32::from_planes(&planes_of(&planes)?);
    let params = params(&planes, beta, causal)?;
    let qkv = [
        heads(slice3("q", &q)?)?,
        heads(slice3("k", &k)?)?,
        heads(slice3("v", &v)?)?,
    ];
    let pb = problem(&params, &planes, qkv, None, Held::Inputs)?;
    let (o, kept) = py
        .detach(|| {
            let mut o = output(pb.output_len());
            let kept = CpuRace::detected().forward_into(&pb, &mut o, pooled());
            kept.map(|k| (o, k))
        })
        .map_err(py_err)?;
    let o = aligned(py, o, &[qkv[0].heads(), qkv[0].n(), qkv[2].cols()])?;
    Ok((
        o,
        Saved {
            kept,
            planes,
            params,
        },
    ))
}

/// Production f32 soft-RACE backward: `(dq, dk, dv, dbeta)` for the forward that returned
/// `saved` and `o`, with `g = ∂ℓ/∂Ô` ([`Backend::backward_into`] of [`CpuRace`]).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn soft_backward<'py>(
    py: Python<'py>,
    saved: &Saved,
    q: PyReadonlyArray3<'py, f32>,
    k: PyReadonlyArray3<'py, f32>,
    v: PyReadonlyArray3<'py, f32>,
    o: PyReadonlyArray3<'py, f32>,
    g: PyReadonlyArray3<'py, f32>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, f64)> {
    let qkv = [
        heads(slice3("q", &q)?)?,
        heads(slice3("k", &k)?)?,
        heads(slice3("v", &v)?)?,
    ];
    let (oh, gh) = (heads(slice3("o", &o)?)?, heads(slice3("g", &g)?)?);
    if (oh.heads(), oh.n(), oh.cols()) != (gh.heads(), gh.n(), gh.cols()) {
        return Err(py_err(RaceError::shape(
            "o",
            "o and g must have the forward's output shape",
        )));
    }
    let pb = problem(&saved.params, &saved.planes, qkv, Some(gh), Held::Forward)?;
    let [qh, kh, vh] = qkv;
    let (dq, dk, dv, dbeta) = py
        .detach(|| {
            let (mut dq, mut dk, mut dv) = (
                output(qh.data().len()),
                output(kh.data().len()),
                output(vh.data().len()),
            );
            let grads = GradsMut {
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
            };
            let dbeta = CpuRace::detected().backward_into(&pb, &saved.kept, oh.data(), grads);
            dbeta.map(|db| (dq, dk, dv, db))
        })
        .map_err(py_err)?;
    Ok((
        aligned(py, dq, &[qh.heads(), qh.n(), qh.cols()])?,
        aligned(py, dk, &[kh.heads(), kh.n(), kh.cols()])?,
        aligned(py, dv, &[vh.heads(), vh.n(), vh.cols()])?,
        dbeta,
    ))
}

/// `[heads, n, cols]` f64 arrays as tensors (one copy each), checked as `attend` checks them;
/// [`Tensor::heads`] gives their per-head views.
fn tensors64(
    q: &PyReadonlyArray3<'_, f64>,
    k: &PyReadonlyArray3<'_, f64>,
    v: &PyReadonlyArray3<'_, f64>,
    planes: &Planes,
    causal: bool,
) -> PyResult<[Tensor<f64>; 3]> {
    let mut out = Vec::new();
    for (name, a) in [("q", q), ("k", k), ("v", v)] {
        let (data, dims) = slice3(name, a)?;
        out.push(Tensor::new(dims.to_vec(), data.to_vec()).map_err(py_err)?);
    }
    let shape =
        check_qkv(&out[0].view(), &out[1].view(), &out[2].view(), causal).map_err(py_err)?;
    if shape.d != planes.d() {
        return Err(py_err(RaceError::shape(
            "planes",
            format!(
                "planes have d = {} but q/k have d = {}",
                planes.d(),
                shape.d
            ),
        )));
    }
    let [q, k, v]: [Tensor<f64>; 3] = out.try_into().expect("three tensors");
    Ok([q, k, v])
}

/// The per-head views of checked tensors.
fn views(t: &[Tensor<f64>; 3]) -> PyResult<[Vec<MatRef<'_, f64>>; 3]> {
    Ok([
        t[0].heads("q").map_err(py_err)?,
        t[1].heads("k").map_err(py_err)?,
        t[2].heads("v").map_err(py_err)?,
    ])
}

/// `f(h)` for every head, heads in parallel.
fn per_head<T: Send>(heads: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    (0..heads).into_par_iter().map(f).collect()
}

/// The f64 log-domain reference forward (exact at any β; `combine` "paper" or "authors").
#[pyfunction]
fn soft_forward_f64<'py>(
    q: PyReadonlyArray3<'py, f64>,
    k: PyReadonlyArray3<'py, f64>,
    v: PyReadonlyArray3<'py, f64>,
    planes: PyReadonlyArray3<'py, f64>,
    beta: f64,
    causal: bool,
    combine: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let py = q.py();
    let combine: Combine = combine.parse().map_err(py_err)?;
    let planes = planes_of(&planes)?;
    racelab_core::params::validate_beta(beta).map_err(py_err)?;
    let t = tensors64(&q, &k, &v, &planes, causal)?;
    let [qh, kh, vh] = views(&t)?;
    let (n, dv) = (qh[0].rows, vh[0].cols);
    let o = py.detach(|| {
        per_head(qh.len(), |h| {
            soft_race_log(qh[h], kh[h], vh[h], &planes, beta, causal, combine)
                .o
                .data
        })
    });
    array(py, o.concat(), &[qh.len(), n, dv])
}

/// The f64 log-domain reference backward (paper combine rule): `(dq, dk, dv, dbeta)`.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn soft_backward_f64<'py>(
    q: PyReadonlyArray3<'py, f64>,
    k: PyReadonlyArray3<'py, f64>,
    v: PyReadonlyArray3<'py, f64>,
    g: PyReadonlyArray3<'py, f64>,
    planes: PyReadonlyArray3<'py, f64>,
    beta: f64,
    causal: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>, f64)> {
    let py = q.py();
    let planes = planes_of(&planes)?;
    racelab_core::params::validate_beta(beta).map_err(py_err)?;
    let t = tensors64(&q, &k, &v, &planes, causal)?;
    let [qh, kh, vh] = views(&t)?;
    let (gdata, gdims) = slice3("g", &g)?;
    let (h, n, dv) = (qh.len(), qh[0].rows, vh[0].cols);
    if gdims != [h, n, dv] {
        return Err(py_err(RaceError::shape(
            "g",
            format!("g is {gdims:?} but the output is [{h}, {n}, {dv}]"),
        )));
    }
    racelab_core::tensor::check_finite("g", gdata).map_err(py_err)?;
    let gh: Vec<MatRef<f64>> = gdata
        .chunks_exact(n * dv)
        .map(|c| MatRef::new(n, dv, c).map_err(py_err))
        .collect::<PyResult<_>>()?;
    let grads = py.detach(|| {
        per_head(qh.len(), |h| {
            soft_race_backward_log(qh[h], kh[h], vh[h], gh[h], &planes, beta, causal)
        })
    });
    let cat =
        |f: &dyn Fn(&racelab_core::reference::backward::SoftGrads64) -> &Mat<f64>| -> Vec<f64> {
            grads
                .iter()
                .flat_map(|g| f(g).data.iter().copied())
                .collect()
        };
    let (m, d) = (kh[0].rows, qh[0].cols);
    Ok((
        array(py, cat(&|g| &g.dq), &[h, n, d])?,
        array(py, cat(&|g| &g.dk), &[h, m, d])?,
        array(py, cat(&|g| &g.dv), &[h, m, dv])?,
        grads.iter().map(|g| g.dbeta).sum(),
    ))
}

/// Whether this build has the CUDA backend and a device is present.
#[pyfunction]
fn cuda_available() -> bool {
    racelab_core::cuda::ensure_device().is_ok()
}

/// The level the CPU kernels run at here: `avx512f`, `avx2+fma` or `scalar` (`RACELAB_ISA`
/// lowers it; on aarch64 `scalar`, where the native-width passes run on NEON, its baseline).
#[pyfunction]
fn cpu_isa() -> &'static str {
    racelab_core::cpu::detected_isa().name()
}

#[pymodule]
fn _racelab(m: &Bound<'_, PyModule>) -> PyResult<()> {
    racelab_core::error::set_spelling(Spelling::Python);
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Saved>()?;
    m.add_function(wrap_pyfunction!(planes, m)?)?;
    m.add_function(wrap_pyfunction!(attend, m)?)?;
    m.add_function(wrap_pyfunction!(soft_forward, m)?)?;
    m.add_function(wrap_pyfunction!(soft_backward, m)?)?;
    m.add_function(wrap_pyfunction!(soft_forward_f64, m)?)?;
    m.add_function(wrap_pyfunction!(soft_backward_f64, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_isa, m)?)?;
    m.add_function(wrap_pyfunction!(empty_cache, m)?)?;
    Ok(())
}
