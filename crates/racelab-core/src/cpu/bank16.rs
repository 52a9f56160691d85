//! Products with a small state, its chunks held in registers, for banks of at most 16
//! features (`(2, 2)`: 8 features), written once over 16-lane rows for every ISA
//! ([`super::v16`]): the causal sub-blocks' read-then-update in
//! one pass (`read_update`), and the non-causal passes' reads (`read`: `O = (Φ/Den) B`,
//! `∂ℓ/∂V = Φ_K dB`) and updates (`update`: the key bank `Φ_Kᵀ [V | 1]`, `dB = (c ⊙ Φ_Q)ᵀ G`).
//!
//! A causal sub-block first reads the state `S = base + local` (`m × ld`, `m ≤ 16` feature
//! rows; `base` may be absent) and then adds its own tokens to `local`:
//!
//! ```text
//! D_i    = Σ_f a_if S_f              (read: rows a_i, m wide; D's first dv columns)
//! local_f += Σ_j b_jf x_j            (update: rows b_j, m wide, and x_j, dv wide)
//! local_f[dv] += Σ_j b_jf ω_j        (the mass column, with weights ω: 1, or −s_j)
//! ```
//!
//! As two `super::gemm` calls each pass reads and writes the whole state and pays a fixed
//! cost per call; a 16-token update at `m = 8` took 715–770 cycles alone (at a nominal
//! 4 GHz, in cache). Here, per 16-column chunk (two chunks per step at `m ≤ 8`), the chunk of
//! `S` is loaded once into registers, the read runs over the rows with every `a_if`
//! broadcast from memory into its FMA, and the update accumulates into registers that are
//! added to `local` once. The update's sums run over `j` in order from zero and are then
//! added to `local`, as `super::gemm` with `accumulate` does, so the two-level state keeps
//! its accuracy. Features `f ≥ m` are padding: the rows `a`, `b` have stride 16 and zeros
//! there.
//!
//! Why: with the state's chunks held in registers across the sub-block, a read and update of
//! a 16-token sub-block at `m = 8` takes about 1200 cycles in cache (nominal 4 GHz) against
//! about 1560 with one chunk per step. In the non-causal passes rows go in groups of 16, so a
//! group stays in L1 over the chunks, with a drip per step as `gemm`'s tiles have (without
//! it the prefetch and the write-behind stall).

use super::gemm::{load, store};
use super::native::Native;
use super::simd::{dispatch, Isa, Kernel, Level, Token};
use super::v16::{self, V16};

/// The mass column's weights `ω_j` for [`read_update`]'s update.
#[derive(Clone, Copy)]
pub(crate) enum Mass<'a> {
    /// `ω_j = 1` (a key bank: the masses count the features).
    Ones,
    /// `ω_j = −s_j` (the keys' `dS`: `dA_f = −Σ_j c_j φ_jf s_j`, with `c` already in `b`).
    NegS(&'a [f32]),
    /// The mass column is left alone (the caller has it).
    Skip,
}

/// The read half of [`read_update`]: rows `a` (`rows × 16`, stride 16, zero past `m`; any
/// number of rows) and the output `d` (row stride `ldd`, first `dv` columns written).
pub(crate) struct Read<'a> {
    pub a: &'a [f32],
    pub rows: usize,
    pub d: &'a mut [f32],
    pub ldd: usize,
}

/// The update half of [`read_update`]: rows `b` (`rows × 16`, stride 16, zero past `m`; any
/// number of rows), values `x` (row stride `ldx`, `dv` wide) and the mass weights.
pub(crate) struct Update<'a> {
    pub b: &'a [f32],
    pub rows: usize,
    pub x: &'a [f32],
    pub ldx: usize,
    pub mass: Mass<'a>,
}

/// Whether [`read_update`] runs for this bank width (at most 16 features: a feature row is
/// one 16-lane vector; every ISA, see [`super::v16`]).
pub(crate) fn applies(_isa: Isa, m: usize) -> bool {
    m <= 16
}

/// Read `D = A S` then update `local += Bᵀ X` (and the mass column) for the state
/// `S = base + local` (`base` empty: `S = local`), `m` rows of stride `ld`, `dv + 1` columns
/// used (the values and the mass column `dv`). Panics unless [`applies`] (a programming
/// error) or when an operand is too short.
pub(crate) fn read_update(
    isa: Isa,
    m: usize,
    dv: usize,
    (base, local, ld): (&[f32], &mut [f32], usize),
    read: Option<Read>,
    update: Option<Update>,
) {
    check(
        isa,
        m,
        dv,
        (base, local, ld),
        read.as_ref(),
        update.as_ref(),
    );
    let local = Local::Mut(local);
    Pass::new(isa, m, dv, (base, local, ld), read, update).run(isa)
}

/// `D = A S` alone, for a state `s` (`m` rows of stride `ld`) that is only read (the
/// non-causal read of a finished bank, the keys' `Φ_K dB`).
pub(crate) fn read(isa: Isa, m: usize, dv: usize, (s, ld): (&[f32], usize), r: Read) {
    check(isa, m, dv, (&[], s, ld), Some(&r), None);
    let local = Local::Shared(s);
    Pass::new(isa, m, dv, (&[], local, ld), Some(r), None).run(isa)
}

/// `local += Bᵀ X` (and the mass column as `u.mass` says) alone.
pub(crate) fn update(isa: Isa, m: usize, dv: usize, (local, ld): (&mut [f32], usize), u: Update) {
    read_update(isa, m, dv, (&[], local, ld), None, Some(u))
}

/// `local = Bᵀ X` (and the mass column as `u.mass` says; [`Mass::Skip`] leaves it to the
/// caller): [`update`] of a zeroed state, for banks built one block at a time.
pub(crate) fn assign(isa: Isa, m: usize, dv: usize, (local, ld): (&mut [f32], usize), u: Update) {
    local.fill(0.0);
    update(isa, m, dv, (local, ld), u)
}

/// The bounds every entry point asserts.
fn check(
    isa: Isa,
    m: usize,
    dv: usize,
    (base, local, ld): (&[f32], &[f32], usize),
    read: Option<&Read>,
    update: Option<&Update>,
) {
    assert!(applies(isa, m), "bank16: at most 16 features");
    assert!(ld > dv && local.len() >= m * ld && (base.is_empty() || base.len() >= m * ld));
    if let Some(r) = read {
        assert!(r.a.len() >= r.rows * 16);
        assert!(r.rows == 0 || r.d.len() >= (r.rows - 1) * r.ldd + dv);
    }
    if let Some(u) = update {
        assert!(u.b.len() >= u.rows * 16);
        assert!(u.rows == 0 || u.x.len() >= (u.rows - 1) * u.ldx + dv);
        if let Mass::NegS(s) = u.mass {
            assert!(s.len() >= u.rows);
        }
    }
}

impl<'a, 'b> Pass<'a, 'b> {
    fn new(
        isa: Isa,
        m: usize,
        dv: usize,
        (base, local, ld): (&'a [f32], Local<'a>, usize),
        read: Option<Read<'b>>,
        update: Option<Update<'b>>,
    ) -> Self {
        let wide = isa.level() == Level::Avx512;
        Pass {
            m,
            dv,
            base,
            local,
            ld,
            read,
            update,
            wide,
        }
    }
}

/// The state's `local` part: written by an update, only read without one.
enum Local<'a> {
    Shared(&'a [f32]),
    Mut(&'a mut [f32]),
}

impl Local<'_> {
    #[inline(always)]
    fn get(&self) -> &[f32] {
        match self {
            Local::Shared(x) => x,
            Local::Mut(x) => x,
        }
    }
}

/// The pass of [`read_update`], as a kernel for [`dispatch`].
struct Pass<'a, 'b> {
    m: usize,
    dv: usize,
    base: &'a [f32],
    local: Local<'a>,
    ld: usize,
    read: Option<Read<'b>>,
    update: Option<Update<'b>>,
    /// Two 16-column chunks per step at `m ≤ 8` (AVX-512: 32 registers hold them).
    wide: bool,
}

impl Pass<'_, '_> {
    /// AVX-512 holds the state's chunks in its 32 registers ([`run`]); every other ISA
    /// (sixteen `ymm` on AVX2, NEON's 32 `q` registers hold a quarter of a 16-lane chunk each)
    /// streams them from L1 at its own width ([`run_n`]).
    fn run(self, isa: Isa) {
        dispatch(isa, self)
    }
}

impl Kernel for Pass<'_, '_> {
    type Output = ();
    #[inline(always)]
    fn run<T: Token>(self, t: T) {
        if T::ROW_IN_REGISTER {
            run(t.w16(), self)
        } else {
            run_n(t.native(), self)
        }
    }
}

/// The groups of [`run`] (rows in groups of at most [`GROUP`], a group's read before its
/// update), each by `body`.
#[inline(always)]
fn groups(pass: Pass, mut body: impl FnMut(StateMut, Option<&mut Read>, Option<&Update>)) {
    let Pass {
        dv: _,
        m: _,
        base,
        mut local,
        ld,
        mut read,
        update,
        wide: _,
    } = pass;
    let rows = match (&read, &update) {
        (Some(r), _) => r.rows,
        (None, Some(u)) => u.rows,
        (None, None) => 0,
    };
    assert!(
        update.as_ref().is_none_or(|u| u.rows == rows),
        "bank16: read and update rows"
    );
    // Grouped, a later group's read would see an earlier group's update.
    assert!(
        read.is_none() || update.is_none() || rows <= GROUP,
        "bank16: one group"
    );
    // At least one group, so that an update of no rows still adds its (zero) masses.
    let mut g0 = 0;
    loop {
        let g1 = (g0 + GROUP).min(rows);
        let mut r = read.as_mut().map(|r| {
            let from = (g0 * r.ldd).min(r.d.len());
            Read {
                a: &r.a[g0 * 16..],
                rows: g1 - g0,
                d: &mut r.d[from..],
                ldd: r.ldd,
            }
        });
        let u = update.as_ref().map(|u| Update {
            b: &u.b[g0 * 16..],
            rows: g1 - g0,
            x: &u.x[(g0 * u.ldx).min(u.x.len())..],
            ldx: u.ldx,
            mass: match u.mass {
                Mass::NegS(s) => Mass::NegS(&s[g0..]),
                other => other,
            },
        });
        body((base, &mut local, ld), r.as_mut(), u.as_ref());
        g0 = g1;
        if g0 >= rows {
            break;
        }
    }
}

/// The state as a group sees it: `base` (may be empty), `local`, their row stride.
type StateMut<'s, 'a> = (&'a [f32], &'s mut Local<'a>, usize);

/// The mass column of a group's update: `local_f[dv] += Σ_j ω_j b_jf` (plain loops over the
/// 16-float rows, which the frame vectorises).
#[inline(always)]
fn mass_column(m: usize, dv: usize, (lp, ld): (&mut [f32], usize), u: &Update) {
    let mut md = [0.0f32; 16];
    for j in 0..u.rows {
        let row: &[f32; 16] = u.b[j * 16..j * 16 + 16].try_into().unwrap();
        let w = match u.mass {
            Mass::Ones => 1.0,
            Mass::NegS(s) => -s[j],
            Mass::Skip => return,
        };
        md.iter_mut().zip(row).for_each(|(a, &b)| *a += w * b);
    }
    for (f, &x) in md.iter().enumerate().take(m) {
        lp[f * ld + dv] += x;
    }
}

/// Rows per register tile of [`run_n`]'s read.
const NR: usize = 4;
/// Column chunks (of the native width) per step of [`run_n`].
const CH_N: usize = 2;
/// Features per pass of [`run_n`]'s update (one accumulator per feature and column chunk:
/// `FB × CH_N` of them, with `CH_N` value chunks and one broadcast, fit AVX2's sixteen
/// registers).
const FB: usize = 4;

/// [`run`] at the native width, for ISAs whose registers cannot hold a 16-column chunk of
/// the state: per step of `CH_N` chunks of columns ([`step_n`]), the read keeps `NR × CH_N`
/// accumulators and loads each state chunk `S_f = base_f + local_f` from L1 once per tile of
/// `NR` rows (sums over `f` in order); the update keeps `FB` feature rows' accumulators of
/// the `CH_N` chunks, sums over `j` in order from zero, then adds them to `local`.
#[inline(always)]
fn run_n<S: Native>(simd: S, pass: Pass) {
    let (m, dv) = (pass.m, pass.dv);
    let lanes = S::LANES;
    groups(
        pass,
        #[inline(always)]
        |(base, local, ld), mut read, update| {
            let mut c0 = 0;
            while c0 < dv {
                let mut len = [0usize; CH_N];
                for (c, l) in len.iter_mut().enumerate() {
                    *l = dv.saturating_sub(c0 + c * lanes).min(lanes);
                }
                let state = (base, &mut *local, ld);
                // Whole chunks (every step but perhaps the last) are a separate instance, with
                // no partial loads: those are calls, around which the accumulators would be
                // kept in memory.
                if len == [lanes; CH_N] {
                    step_n::<S, true>(simd, (m, c0, len), state, read.as_deref_mut(), update);
                } else {
                    step_n::<S, false>(simd, (m, c0, len), state, read.as_deref_mut(), update);
                }
                c0 += CH_N * lanes;
            }
            if let (Some(u), Local::Mut(lp)) = (update, local) {
                mass_column(m, dv, (lp, ld), u);
            }
        },
    );
}

/// One step of [`run_n`]: the columns `c0..` in `CH_N` chunks of `len` lanes (`FULL`: every
/// chunk whole).
#[inline(always)]
fn step_n<S: Native, const FULL: bool>(
    simd: S,
    (m, c0, len): (usize, usize, [usize; CH_N]),
    (base, local, ld): StateMut,
    read: Option<&mut Read>,
    update: Option<&Update>,
) {
    let lanes = S::LANES;
    let zero = simd.splat_f32s(0.0);
    let at = |c: usize| c0 + c * lanes;
    if let Some(r) = read {
        let lv = local.get();
        let mut i = 0;
        while i < r.rows {
            let nr = (r.rows - i).min(NR);
            // Rows past the end repeat the last one (their sums are not stored).
            let mut arow: [&[f32]; NR] = [&[]; NR];
            for (q, a) in arow.iter_mut().enumerate() {
                let o = (i + q.min(nr - 1)) * 16;
                *a = &r.a[o..o + 16];
            }
            let mut acc = [[zero; CH_N]; NR];
            // `f` steps the state's rows (`f * ld`) and the read rows' columns alike.
            #[allow(clippy::needless_range_loop)]
            for f in 0..m {
                let mut sv = [zero; CH_N];
                for (c, v) in sv.iter_mut().enumerate() {
                    *v = load_n::<S, FULL>(simd, lv, f * ld + at(c), len[c]);
                    if !base.is_empty() {
                        let b = load_n::<S, FULL>(simd, base, f * ld + at(c), len[c]);
                        *v = simd.add_f32s(*v, b);
                    }
                }
                for (q, aq) in acc.iter_mut().enumerate() {
                    let x = simd.splat_f32s(arow[q][f]);
                    for (c, aqc) in aq.iter_mut().enumerate() {
                        *aqc = simd.mul_add_e_f32s(x, sv[c], *aqc);
                    }
                }
            }
            for (q, aq) in acc.iter().enumerate().take(nr) {
                for (c, &v) in aq.iter().enumerate() {
                    store_n::<S, FULL>(simd, r.d, (i + q) * r.ldd + at(c), len[c], v);
                }
            }
            i += NR;
        }
        super::mem::drip();
    }
    if let (Some(u), Local::Mut(lp)) = (update, local) {
        let mut f0 = 0;
        while f0 < m {
            let mut dl = [[zero; CH_N]; FB];
            for j in 0..u.rows {
                let mut xv = [zero; CH_N];
                for (c, x) in xv.iter_mut().enumerate() {
                    *x = load_n::<S, FULL>(simd, u.x, j * u.ldx + at(c), len[c]);
                }
                let row = &u.b[j * 16 + f0..j * 16 + f0 + FB];
                for (f, df) in dl.iter_mut().enumerate() {
                    let b = simd.splat_f32s(row[f]);
                    for (c, d) in df.iter_mut().enumerate() {
                        *d = simd.mul_add_e_f32s(b, xv[c], *d);
                    }
                }
            }
            for (f, df) in dl.iter().enumerate().take(m - f0) {
                for (c, &d) in df.iter().enumerate() {
                    let o = (f0 + f) * ld + at(c);
                    let sum = simd.add_f32s(load_n::<S, FULL>(simd, lp, o, len[c]), d);
                    store_n::<S, FULL>(simd, lp, o, len[c], sum);
                }
            }
            f0 += FB;
        }
        super::mem::drip();
    }
}

/// [`load`] in [`step_n`]: a whole chunk by one plain load when `FULL` (no partial path in
/// that instance, whatever the optimiser makes of `len`).
#[inline(always)]
fn load_n<S: Native, const FULL: bool>(s: S, x: &[f32], at: usize, len: usize) -> S::f32s {
    if FULL {
        S::as_simd_f32s(&x[at..at + S::LANES]).0[0]
    } else {
        load(s, x, at, len)
    }
}

/// [`store`] in [`step_n`], as [`load_n`].
#[inline(always)]
fn store_n<S: Native, const FULL: bool>(s: S, out: &mut [f32], at: usize, len: usize, v: S::f32s) {
    if FULL {
        S::as_mut_simd_f32s(&mut out[at..at + S::LANES]).0[0] = v;
    } else {
        store(s, out, at, len, v)
    }
}

/// [`read_update`]'s body for `M = 8` or `16` register rows, the rows in groups of at most
/// [`GROUP`] (so that a group's rows stay in the L1 cache over the column chunks); a group's
/// read comes before its update.
#[inline(always)]
fn run<S: V16>(simd: S, pass: Pass) {
    let (m, dv, wide) = (pass.m, pass.dv, pass.wide);
    groups(
        pass,
        #[inline(always)]
        |st, r, u| {
            if m <= 8 {
                group::<S, 8>(simd, m, dv, st, r, u, wide);
            } else {
                group::<S, 16>(simd, m, dv, st, r, u, wide);
            }
        },
    );
}

/// Rows per group in [`run`].
const GROUP: usize = 16;

/// One group of rows with `M ≥ m` register rows (8 or 16): the column chunks, then the mass
/// column. With `wide` and 8 rows, `CH = 2` chunks of 16 columns per step (each broadcast
/// then serves two FMAs, and the update has 16 independent sums rather than 8, which is what
/// the FMA latency needs to keep both units busy); else one.
#[inline(always)]
fn group<S: V16, const M: usize>(
    simd: S,
    m: usize,
    dv: usize,
    (base, local, ld): (&[f32], &mut Local, usize),
    mut read: Option<&mut Read>,
    update: Option<&Update>,
    wide: bool,
) {
    let mut c0 = 0;
    if M == 8 && wide {
        while c0 + 32 <= dv {
            let st = (base, &mut *local, ld);
            step::<S, M, 2>(simd, m, c0, [16; 2], st, read.as_deref_mut(), update);
            c0 += 32;
        }
    }
    while c0 < dv {
        let len = (dv - c0).min(16);
        let st = (base, &mut *local, ld);
        step::<S, M, 1>(simd, m, c0, [len], st, read.as_deref_mut(), update);
        c0 += 16;
    }
    if let (Some(u), Local::Mut(lp)) = (update.filter(|u| !matches!(u.mass, Mass::Skip)), local) {
        // The mass column: Σ_j ω_j b_j, one 16-lane vector over the features.
        let mut md = simd.splat_f32s(0.0);
        for j in 0..u.rows {
            let row = v16::load(simd, u.b, j * 16);
            md = match u.mass {
                Mass::Ones => simd.add_f32s(md, row),
                Mass::NegS(s) => simd.mul_add_e_f32s(row, simd.splat_f32s(-s[j]), md),
                Mass::Skip => md,
            };
        }
        for (f, &x) in v16::lanes(md).iter().enumerate().take(m) {
            lp[f * ld + dv] += x;
        }
    }
}

/// Columns `c0 .. c0 + 16·CH` (chunk `c` of `len[c]` columns): the read over all rows, then
/// the update.
#[inline(always)]
fn step<S: V16, const M: usize, const CH: usize>(
    simd: S,
    m: usize,
    c0: usize,
    len: [usize; CH],
    (base, local, ld): (&[f32], &mut Local, usize),
    read: Option<&mut Read>,
    update: Option<&Update>,
) {
    let col = |c: usize| c0 + 16 * c;
    let zero = simd.splat_f32s(0.0);
    if let Some(r) = read {
        // The state's chunks, S_f = base_f + local_f (0 for the padding rows f ≥ m).
        let lv = local.get();
        let mut s = [[zero; CH]; M];
        // All `M` rows visited (those past `m` skipped): a loop of constant length unrolls, so
        // every index into `s` is a constant and `s` lives in registers. Over `take(m)` it
        // stayed in memory, and each FMA of the read took its operand from the stack.
        for (f, sf) in s.iter_mut().enumerate() {
            if f >= m {
                continue;
            }
            for (c, sfc) in sf.iter_mut().enumerate() {
                *sfc = v16::load_n(simd, lv, f * ld + col(c), len[c]);
                if !base.is_empty() {
                    let b = v16::load_n(simd, base, f * ld + col(c), len[c]);
                    *sfc = simd.add_f32s(*sfc, b);
                }
            }
        }
        // Rows in groups of 4 (1 at the end), two chains (even and odd f) per row and chunk.
        let mut i = 0;
        while i < r.rows {
            let nr = if i + 4 <= r.rows { 4 } else { 1 };
            let mut acc = [[[zero; 2]; CH]; 4];
            for f in (0..M).step_by(2) {
                for (q, aq) in acc.iter_mut().enumerate().take(nr) {
                    let row = &r.a[(i + q) * 16..(i + q) * 16 + 16];
                    let (x0, x1) = (simd.splat_f32s(row[f]), simd.splat_f32s(row[f + 1]));
                    for (c, aqc) in aq.iter_mut().enumerate() {
                        aqc[0] = simd.mul_add_e_f32s(x0, s[f][c], aqc[0]);
                        aqc[1] = simd.mul_add_e_f32s(x1, s[f + 1][c], aqc[1]);
                    }
                }
            }
            for (q, aq) in acc.iter().enumerate().take(nr) {
                for (c, aqc) in aq.iter().enumerate() {
                    let at = (i + q) * r.ldd + col(c);
                    v16::store_n(simd, r.d, at, len[c], simd.add_f32s(aqc[0], aqc[1]));
                }
            }
            i += nr;
        }
        // Keep the prefetch and write-behind drips going, as `gemm`'s tiles do.
        super::mem::drip();
    }
    if let (Some(u), Local::Mut(lp)) = (update, local) {
        // Σ_j b_jf x_j from zero, then into local (as gemm's accumulate).
        let mut dl = [[zero; CH]; M];
        for j in 0..u.rows {
            // (A loop, not `std::array::from_fn`, whose closure is compiled outside the frame.)
            let mut xv = [zero; CH];
            for (c, x) in xv.iter_mut().enumerate() {
                *x = v16::load_n(simd, u.x, j * u.ldx + col(c), len[c]);
            }
            let row = &u.b[j * 16..j * 16 + 16];
            for (f, df) in dl.iter_mut().enumerate() {
                let bf = simd.splat_f32s(row[f]);
                for (c, dfc) in df.iter_mut().enumerate() {
                    *dfc = simd.mul_add_e_f32s(bf, xv[c], *dfc);
                }
            }
        }
        for (f, df) in dl.iter().enumerate() {
            if f >= m {
                continue;
            }
            for (c, dfc) in df.iter().enumerate() {
                let at = f * ld + col(c);
                let sum = simd.add_f32s(v16::load_n(simd, lp, at, len[c]), *dfc);
                v16::store_n(simd, lp, at, len[c], sum);
            }
        }
        super::mem::drip();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::simd::{Isa, Level};

    /// A small deterministic generator (tests only).
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Feature rows of 16 floats with zeros past `m`, as the kernels' feature buffers are.
    fn rows16(seed: u64, rows: usize, m: usize) -> Vec<f32> {
        let mut x = values(seed, rows * 16);
        x.chunks_exact_mut(16).for_each(|r| r[m..].fill(0.0));
        x
    }

    /// `read_update`, `read` and `update` against the definitions in f64, for every bank
    /// width 1..=16, column counts with and without a partial chunk, row counts from 0 to
    /// more than one group, with and without the base part, and each mass weighting; the
    /// state's columns past `dv + 1` and the output's past `dv` must stay untouched.
    #[test]
    fn bank16_matches_its_definition() {
        let mut isas: Vec<Isa> = [Level::Scalar, Level::Avx2, Level::Avx512]
            .into_iter()
            .map(Isa::at_most)
            .collect();
        isas.dedup();
        for isa in isas {
            for m in 1..=16 {
                for dv in [1, 5, 16, 33, 128] {
                    for rows in [0, 1, 7, 16, 40] {
                        for (case, two) in [(0u64, false), (1, true)] {
                            let seed = (m * 1000 + dv * 10 + rows) as u64 * 4 + case;
                            let ld = dv + 3;
                            let base = if two { values(seed, m * ld) } else { vec![] };
                            let local0 = values(seed + 1, m * ld);
                            let (a, b) = (rows16(seed + 2, rows, m), rows16(seed + 3, rows, m));
                            let (ldx, ldd) = (dv + 2, dv + 1);
                            let x = values(seed + 4, rows * ldx);
                            let s = values(seed + 5, rows);
                            let s_at = |f: usize, c: usize| {
                                local0[f * ld + c] as f64
                                    + base.get(f * ld + c).map_or(0.0, |&v| v as f64)
                            };
                            let want_d = |i: usize, c: usize| {
                                (0..m)
                                    .map(|f| a[i * 16 + f] as f64 * s_at(f, c))
                                    .sum::<f64>()
                            };
                            let check_d = |d: &[f32], what: &str| {
                                for i in 0..rows {
                                    for c in 0..ldd {
                                        let got = d[i * ldd + c];
                                        if c < dv {
                                            let want = want_d(i, c);
                                            let tol = 1e-5 * (1.0 + want.abs());
                                            assert!((got as f64 - want).abs() <= tol, "{what} m={m} dv={dv} rows={rows} two={two} D[{i}][{c}] = {got}, want {want}");
                                        } else {
                                            assert!(got.is_nan(), "{what}: wrote past dv");
                                        }
                                    }
                                }
                            };
                            for (mi, mass) in [Mass::Ones, Mass::NegS(&s), Mass::Skip]
                                .into_iter()
                                .enumerate()
                            {
                                let weight = |j: usize| match mi {
                                    0 => 1.0,
                                    1 => -(s[j] as f64),
                                    _ => 0.0,
                                };
                                let check_local = |local: &[f32], what: &str| {
                                    for f in 0..m {
                                        for c in 0..ld {
                                            let got = local[f * ld + c] as f64;
                                            let delta: f64 = if c < dv {
                                                (0..rows)
                                                    .map(|j| {
                                                        b[j * 16 + f] as f64 * x[j * ldx + c] as f64
                                                    })
                                                    .sum()
                                            } else if c == dv {
                                                (0..rows)
                                                    .map(|j| b[j * 16 + f] as f64 * weight(j))
                                                    .sum()
                                            } else {
                                                0.0
                                            };
                                            let want = local0[f * ld + c] as f64 + delta;
                                            let tol = 1e-5 * (1.0 + want.abs());
                                            assert!((got - want).abs() <= tol, "{what} m={m} dv={dv} rows={rows} mass={mi} local[{f}][{c}] = {got}, want {want}");
                                        }
                                    }
                                };
                                // Update alone (any number of rows).
                                let mut local = local0.clone();
                                let upd = || Update {
                                    b: &b,
                                    rows,
                                    x: &x,
                                    ldx,
                                    mass,
                                };
                                update(isa, m, dv, (&mut local, ld), upd());
                                check_local(&local, "update");
                                // Read and update in one pass (one group of rows at most).
                                if rows <= GROUP {
                                    let mut local = local0.clone();
                                    let mut d = vec![f32::NAN; rows * ldd];
                                    let r = Read {
                                        a: &a,
                                        rows,
                                        d: &mut d,
                                        ldd,
                                    };
                                    let u = Some(upd());
                                    read_update(isa, m, dv, (&base, &mut local, ld), Some(r), u);
                                    check_d(&d, "read_update");
                                    check_local(&local, "read_update");
                                }
                            }
                            // Read alone, of a state without a base part.
                            if !two {
                                let mut d = vec![f32::NAN; rows * ldd];
                                read(
                                    isa,
                                    m,
                                    dv,
                                    (&local0, ld),
                                    Read {
                                        a: &a,
                                        rows,
                                        d: &mut d,
                                        ldd,
                                    },
                                );
                                check_d(&d, "read");
                            }
                        }
                    }
                }
            }
        }
    }
}
