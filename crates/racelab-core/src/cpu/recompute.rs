//! The CPU kernels' finish of the rows they flagged: the exact recompute of
//! [`crate::shared::recompute`], recorded in the kernels' context ([`Ctx`]).

use super::saved::Ctx;
use crate::backend::{BackwardInputs, ForwardInputs, GradsMut};
use crate::shared::recompute::{backward, flagged, forward, Recomputed};
use crate::shared::SoftMap;

/// After a soft-RACE forward kernel that flagged `flagged` rows: recompute them into `o` and
/// record them in `ctx`. Returns the rows with no key at all (left 0).
pub(crate) fn finish_forward(
    map: &SoftMap,
    x: ForwardInputs,
    causal: bool,
    flagged_rows: usize,
    o: &mut [f32],
    ctx: &mut Ctx,
) -> usize {
    if flagged_rows == 0 {
        ctx.recomputed = Recomputed::default();
        return 0;
    }
    let rows = flagged(&ctx.den);
    let (empty, rec) = forward(map, x, causal, rows, o);
    ctx.recomputed = rec;
    empty
}

/// After a soft-RACE backward kernel: add the exact share of the rows `ctx` recomputed.
pub(crate) fn finish_backward(map: &SoftMap, ctx: &Ctx, x: BackwardInputs, out: GradsMut) -> f64 {
    let rows = &ctx.recomputed.rows;
    if rows.is_empty() {
        return 0.0;
    }
    backward(map, x.forward(), x.g, ctx.causal, rows, out)
}
