//! The production CPU kernels as a partial kernel ([`Partial`]): the blocked soft-RACE passes
//! of [`crate::cpu::soft`] on one slice of the token axis, each call checked against the
//! others and against the forward that made its [`SliceSaved`].

use super::saved::{Buffers, Ctx};
use super::soft::{self, Boundary, QuerySaved};
use super::{CpuRace, FeatureMap};
use crate::backend::{BackwardInputs, ForwardInputs, GradsMut, Heads};
use crate::error::{RaceError, Result};
use crate::shared::layout::bank_len;
use crate::shared::recompute::den_floor;
use crate::shared::{plan_segments, zero_banks, Banks, Partial, SoftMap};

/// What a slice's forward ran on: heads, query and key rows, `d`, `dv`, the map's `L·P` and
/// `m`, and whether it was causal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    heads: usize,
    n: usize,
    d: usize,
    dv: usize,
    lp: usize,
    m: usize,
    causal: bool,
}

/// What a slice's forward on the CPU kernels keeps for its backward (opaque): the kernels'
/// context (denominators, the queries' saved projections, segment banks or block states) and
/// the shape it was made for, which every backward call checks.
#[derive(Debug, Default)]
pub struct SliceSaved {
    ctx: Ctx,
    shape: Option<Shape>,
}

fn mismatch(arg: &str, msg: String) -> RaceError {
    RaceError::shape(arg, msg)
}

/// `x` is `[heads, n, cols]` (each `None` not checked).
fn rows(name: &str, x: &Heads, heads: usize, n: Option<usize>, cols: Option<usize>) -> Result<()> {
    let ok = x.heads == heads && n.is_none_or(|n| x.n == n) && cols.is_none_or(|c| x.cols == c);
    if ok {
        return Ok(());
    }
    let want = |v: Option<usize>| v.map_or("·".to_string(), |v| v.to_string());
    Err(mismatch(
        name,
        format!(
            "is [{}, {}, {}] but the slice needs [{heads}, {}, {}]",
            x.heads,
            x.n,
            x.cols,
            want(n),
            want(cols)
        ),
    ))
}

/// The product of `dims`, computed without wrapping (`None` past `usize`).
fn product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &b| a.checked_mul(b))
}

/// A buffer of `got` values where the slice needs `Π dims`.
fn len(name: &str, got: usize, dims: &[usize]) -> Result<()> {
    match product(dims) {
        Some(want) if want == got => Ok(()),
        Some(want) => Err(mismatch(
            name,
            format!("the buffer holds {got} values but the slice needs {want}"),
        )),
        None => Err(mismatch(
            name,
            format!("the slice's shape {dims:?} needs more values than memory can address"),
        )),
    }
}

/// `banks` are `heads` banks of `m · bank_width(dv)` values each (the width computed without
/// wrapping).
fn banks(name: &str, b: &[Vec<f64>], heads: usize, m: usize, dv: usize) -> Result<()> {
    if let Some(w) = bank_len(m, dv) {
        if b.len() == heads && b.iter().all(|x| x.len() == w) {
            return Ok(());
        }
    }
    Err(mismatch(
        name,
        format!(
            "needs {heads} banks of m = {m} rows of width bank_width({dv}) for values of width \
             {dv}, got {} banks of {:?} values",
            b.len(),
            b.first().map(Vec::len)
        ),
    ))
}

impl SliceSaved {
    /// The context, when it came from a forward of `want`.
    fn of(&self, want: Shape) -> Result<&Ctx> {
        match self.shape {
            Some(s) if s == want => Ok(&self.ctx),
            Some(s) => Err(mismatch(
                "saved",
                format!(
                    "comes from a forward of [{}, {}, d = {}, dv = {}]{} with L·P = {}, m = {}, \
                     not of this slice ([{}, {}, {}, {}]{}, L·P = {}, m = {}); pass the \
                     forward's own",
                    s.heads,
                    s.n,
                    s.d,
                    s.dv,
                    if s.causal { ", causal" } else { "" },
                    s.lp,
                    s.m,
                    want.heads,
                    want.n,
                    want.d,
                    want.dv,
                    if want.causal { ", causal" } else { "" },
                    want.lp,
                    want.m
                ),
            )),
            None => Err(mismatch(
                "saved",
                "holds no forward; pass what the slice's forward returned".into(),
            )),
        }
    }
}

/// The queries' saved projections when they fit `q` (else empty: the kernels recompute them).
fn saved_uq<'a>(ctx: &'a Ctx, map: &SoftMap, q: &Heads) -> &'a [f32] {
    let lp = map.planes.l * map.planes.p;
    ctx.saved_u(q, q, lp).0
}

impl CpuRace {
    fn shape(map: &SoftMap, q: &Heads, dv: usize, causal: bool) -> Shape {
        Shape {
            heads: q.heads,
            n: q.n,
            d: q.cols,
            dv,
            lp: map.planes.l * map.planes.p,
            m: map.width(),
            causal,
        }
    }
}

impl Partial for CpuRace {
    type Saved = SliceSaved;

    fn key_banks(&self, map: &SoftMap, k: Heads, v: Heads) -> Result<Banks> {
        rows("k", &k, k.heads, None, Some(map.planes.d))?;
        rows("v", &v, k.heads, Some(k.n), None)?;
        if k.n == 0 {
            return zero_banks(map, k.heads, v.cols);
        }
        Ok(soft::key_banks(map, self.isa, k, v, &mut []))
    }

    fn read(
        &self,
        map: &SoftMap,
        q: Heads,
        (b, dv): (&[Vec<f64>], usize),
        keys: usize,
        o: &mut [f32],
        reuse: SliceSaved,
    ) -> Result<(usize, SliceSaved)> {
        rows("q", &q, q.heads, None, Some(map.planes.d))?;
        banks("banks", b, q.heads, map.width(), dv)?;
        len("o", o.len(), &[q.heads, q.n, dv])?;
        let shape = Some(CpuRace::shape(map, &q, dv, false));
        let lp = map.planes.l * map.planes.p;
        let (mut den, mut uq) = (reuse.ctx.den, reuse.ctx.uq);
        if q.n == 0 {
            let ctx = Ctx {
                banks: b.to_vec(),
                ..Ctx::default()
            };
            return Ok((0, SliceSaved { ctx, shape }));
        }
        den.resize(q.heads * q.n, 0.0);
        uq.resize(q.heads * q.n * lp, 0.0);
        let bufs = Buffers {
            den,
            uq,
            uk: Vec::new(),
        };
        let floor = den_floor(map.width(), keys);
        let (flagged, ctx) = soft::read_ctx(map, self.isa, q, (b.to_vec(), dv), o, bufs, floor);
        Ok((flagged, SliceSaved { ctx, shape }))
    }

    fn query_grads(
        &self,
        map: &SoftMap,
        saved: &SliceSaved,
        q: Heads,
        g: Heads,
        dq: &mut [f32],
    ) -> Result<(Banks, f64)> {
        let ctx = saved.of(CpuRace::shape(map, &q, g.cols, false))?;
        rows("g", &g, q.heads, Some(q.n), None)?;
        len("dq", dq.len(), &[q.data.len()])?;
        if q.n == 0 {
            return Ok((zero_banks(map, q.heads, g.cols)?, 0.0));
        }
        let uq = saved_uq(ctx, map, &q);
        Ok(soft::query_grads(
            map,
            self.isa,
            QuerySaved::of(ctx, uq),
            q,
            g,
            dq,
        ))
    }

    fn key_grads(
        &self,
        map: &SoftMap,
        dbanks: &[Vec<f64>],
        (k, v): (Heads, Heads),
        (dk, dvv): (&mut [f32], &mut [f32]),
    ) -> Result<f64> {
        rows("k", &k, k.heads, None, Some(map.planes.d))?;
        rows("v", &v, k.heads, Some(k.n), None)?;
        banks("dbanks", dbanks, k.heads, map.width(), v.cols)?;
        len("dk", dk.len(), &[k.data.len()])?;
        len("dv", dvv.len(), &[v.data.len()])?;
        if k.n == 0 {
            return Ok(0.0);
        }
        let segs = plan_segments(k.n, k.heads);
        Ok(soft::key_grads(
            map,
            self.isa,
            (dbanks, &segs),
            (k, &[]),
            v,
            (dk, dvv),
        ))
    }

    fn causal_forward(
        &self,
        map: &SoftMap,
        x: ForwardInputs,
        (before, keys): (&[Vec<f64>], usize),
        o: &mut [f32],
        reuse: SliceSaved,
    ) -> Result<(usize, SliceSaved)> {
        let ForwardInputs { q, k, v } = x;
        rows("q", &q, q.heads, None, Some(map.planes.d))?;
        rows("k", &k, q.heads, Some(q.n), Some(map.planes.d))?;
        rows("v", &v, q.heads, Some(q.n), None)?;
        banks("before", before, q.heads, map.width(), v.cols)?;
        len("o", o.len(), &[q.heads, q.n, v.cols])?;
        let shape = Some(CpuRace::shape(map, &q, v.cols, true));
        if q.n == 0 {
            let saved = SliceSaved {
                shape,
                ctx: Ctx::default(),
            };
            return Ok((0, saved));
        }
        let from = Boundary {
            state: Some(before),
            keys,
        };
        let (flagged, ctx) = soft::causal_forward_from(map, self.isa, x, o, reuse.ctx, from);
        Ok((flagged, SliceSaved { ctx, shape }))
    }

    fn query_totals(
        &self,
        map: &SoftMap,
        saved: &SliceSaved,
        q: Heads,
        g: Heads,
        o: Heads,
    ) -> Result<Banks> {
        let ctx = saved.of(CpuRace::shape(map, &q, g.cols, true))?;
        rows("g", &g, q.heads, Some(q.n), None)?;
        rows("o", &o, q.heads, Some(q.n), Some(g.cols))?;
        if q.n == 0 {
            return zero_banks(map, q.heads, g.cols);
        }
        let uq = saved_uq(ctx, map, &q);
        Ok(soft::causal_backward::query_totals(
            map, self.isa, q, uq, g, o, &ctx.den,
        ))
    }

    fn causal_backward(
        &self,
        map: &SoftMap,
        saved: &SliceSaved,
        x: BackwardInputs,
        after: &[Vec<f64>],
        out: GradsMut,
    ) -> Result<f64> {
        let BackwardInputs { q, k, v, o, g } = x;
        let ctx = saved.of(CpuRace::shape(map, &q, v.cols, true))?;
        rows("k", &k, q.heads, Some(q.n), Some(map.planes.d))?;
        rows("v", &v, q.heads, Some(q.n), None)?;
        rows("o", &o, q.heads, Some(q.n), Some(v.cols))?;
        rows("g", &g, q.heads, Some(q.n), Some(v.cols))?;
        banks("after", after, q.heads, map.width(), v.cols)?;
        len("dq", out.dq.len(), &[q.data.len()])?;
        len("dk", out.dk.len(), &[k.data.len()])?;
        len("dv", out.dv.len(), &[v.data.len()])?;
        if q.n == 0 {
            return Ok(0.0);
        }
        Ok(soft::causal_backward_from(
            map,
            self.isa,
            ctx,
            x,
            out,
            Some(after),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::SliceSaved;
    use crate::backend::{BackwardInputs, ForwardInputs, GradsMut, Heads, PlanesF32};
    use crate::cpu::CpuRace;
    use crate::params::{Bits, Seed, Tables};
    use crate::shared::{zero_banks, Partial, SoftMap};

    /// The argument an error names.
    fn arg_of(e: crate::error::RaceError) -> String {
        e.arg().unwrap_or_default().to_string()
    }

    /// Every call refuses what does not fit, naming the argument: banks of another shape, a
    /// buffer of another length, a `saved` from another forward (causal for non-causal, or
    /// another length) or from none; and the two halves of a slice's backward, fed what fits,
    /// agree with the whole-sequence kernels.
    #[test]
    fn the_partial_kernel_refuses_what_does_not_fit_and_composes() {
        let (h, n, d, dv) = (2usize, 40usize, 6usize, 3usize);
        let x =
            |len: usize, s: f32| -> Vec<f32> { (0..len).map(|i| (i as f32 * s).sin()).collect() };
        let (q, k, v, g) = (
            x(h * n * d, 0.7),
            x(h * n * d, 1.1),
            x(h * n * dv, 0.3),
            x(h * n * dv, 0.9),
        );
        let planes = PlanesF32::from_planes(
            &crate::Planes::gaussian(Bits(2), Tables(3), d, Seed(5)).unwrap(),
        );
        let map = SoftMap::new(&planes, 4.0).unwrap();
        fn hd(a: &[f32], h: usize, n: usize, c: usize) -> Heads<'_> {
            Heads::new(h, n, c, a).unwrap()
        }
        let (qh, kh, vh, gh) = (
            hd(&q, h, n, d),
            hd(&k, h, n, d),
            hd(&v, h, n, dv),
            hd(&g, h, n, dv),
        );
        let cpu = CpuRace::detected();
        let banks = cpu.key_banks(&map, kh, vh).unwrap();
        let mut o = vec![0.0f32; h * n * dv];
        // Non-causal: the read, then the backward's halves.
        let bad = cpu.read(
            &map,
            qh,
            (&banks, dv + 16),
            n,
            &mut o,
            SliceSaved::default(),
        );
        assert_eq!(arg_of(bad.unwrap_err()), "banks");
        let bad = cpu.read(
            &map,
            qh,
            (&banks, dv),
            n,
            &mut o[1..],
            SliceSaved::default(),
        );
        assert_eq!(arg_of(bad.unwrap_err()), "o");
        let (flagged, saved) = cpu
            .read(&map, qh, (&banks, dv), n, &mut o, SliceSaved::default())
            .unwrap();
        assert_eq!(flagged, 0);
        let mut dq = vec![0.0f32; q.len()];
        let none = SliceSaved::default();
        assert_eq!(
            arg_of(cpu.query_grads(&map, &none, qh, gh, &mut dq).unwrap_err()),
            "saved"
        );
        let short = Heads::new(h, n - 1, d, &q[..h * (n - 1) * d]).unwrap();
        let e = cpu.query_grads(&map, &saved, short, gh, &mut dq[..h * (n - 1) * d]);
        assert_eq!(arg_of(e.unwrap_err()), "saved");
        let (dbanks, _) = cpu.query_grads(&map, &saved, qh, gh, &mut dq).unwrap();
        let (mut dk, mut dvv) = (vec![0.0f32; k.len()], vec![0.0f32; v.len()]);
        let e = cpu.key_grads(&map, &dbanks, (kh, vh), (&mut dk[1..], &mut dvv));
        assert_eq!(arg_of(e.unwrap_err()), "dk");
        cpu.key_grads(&map, &dbanks, (kh, vh), (&mut dk, &mut dvv))
            .unwrap();
        // The same as the whole-sequence kernels (one slice is the whole).
        let whole = crate::cpu::soft_forward(&map, qh, kh, vh, false, cpu.isa);
        let close = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
        };
        assert!(close(&o, &whole.o));
        let oh = Heads::new(h, n, dv, &whole.o).unwrap();
        let bx = BackwardInputs::new(qh, kh, vh, oh, gh);
        let want = crate::cpu::soft_backward(&map, &whole.ctx, bx, cpu.isa);
        assert!(close(&dq, &want.dq) && close(&dk, &want.dk) && close(&dvv, &want.dv));
        // Causal: a non-causal `saved` is refused; one slice from zero banks is the whole.
        let zero = zero_banks(&map, h, dv).unwrap();
        // Zero banks past the address space or the memory are refused, not allocated.
        assert!(zero_banks(&map, usize::MAX, dv).is_err());
        assert!(zero_banks(&map, h, usize::MAX).is_err());
        let fx = ForwardInputs::new(qh, kh, vh);
        let (_, csaved) = cpu
            .causal_forward(&map, fx, (&zero, n), &mut o, SliceSaved::default())
            .unwrap();
        let oh = Heads::new(h, n, dv, &o).unwrap();
        let bx = BackwardInputs::new(qh, kh, vh, oh, gh);
        let out = GradsMut {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dvv,
        };
        assert_eq!(
            arg_of(
                cpu.causal_backward(&map, &saved, bx, &zero, out)
                    .unwrap_err()
            ),
            "saved"
        );
        assert_eq!(
            arg_of(cpu.query_totals(&map, &saved, qh, gh, oh).unwrap_err()),
            "saved"
        );
        let out = GradsMut {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dvv,
        };
        let e = cpu.causal_backward(&map, &csaved, bx, &zero[..1], out);
        assert_eq!(arg_of(e.unwrap_err()), "after");
        let out = GradsMut {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dvv,
        };
        cpu.causal_backward(&map, &csaved, bx, &zero, out).unwrap();
        let whole = crate::cpu::soft_forward(&map, qh, kh, vh, true, cpu.isa);
        assert!(close(&o, &whole.o));
        let want = crate::cpu::soft_backward(&map, &whole.ctx, bx, cpu.isa);
        assert!(close(&dq, &want.dq) && close(&dk, &want.dk) && close(&dvv, &want.dv));
    }
}
