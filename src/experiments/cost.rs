//! What each experiment's config asks of the machine, estimated from its sizes before any
//! work: the elementary operations it runs (a multiply-add, a kernel evaluation, a quadrature
//! node) and the bytes its largest buffers hold at once. [`check`] refuses a config whose
//! estimate passes [`MAX_OPS`] or the memory this machine has available, naming its sizes, so
//! that `instances = 10^12` or `n_keys = 10^8` is an error at load time, not a run that never
//! ends or an allocation that aborts.
//!
//! The estimates count the dominant loops of each experiment with the shapes below (their
//! constants are rough; what matters is how they grow with each size):
//!
//! - `race(n, l, p, d, dv) = n·l·(p·d + 2^p·(dv + 1))`: one soft RACE or hard LSH forward on
//!   `n` tokens (projections, then the bucket sums);
//! - `pairs(n, m, w) = n·m·w`: an exact quadratic computation (angular or softmax attention,
//!   an explicit `Ŝ`, `κ` over every pair) with `w` operations per pair;
//! - `QUAD` operations per quadrature table point (`g(θ)` at one `(β, θ)`).

use super::{
    authors, bias, causal, combine, fig3, lemma10, limit, rank, theorem, tradeoff, variance,
};
use crate::error::{RaceError, Result};

/// The operations an experiment may run: about three hours at 10^9 per second (the rate
/// the built-in full configs run at on 2 cores, within a factor of a few). The built-in full
/// configs stay below a tenth of it (`tests` print each estimate).
pub const MAX_OPS: f64 = 1e13;

/// Operations per point of a `g(θ)` quadrature table.
const QUAD: f64 = 4096.0;

/// An estimate, with the sizes it was computed from (named in a refusal).
#[derive(Debug, Clone)]
pub struct Cost {
    pub ops: f64,
    pub bytes: f64,
    pub sizes: String,
}

/// A config whose cost can be estimated from its sizes.
pub trait Costed {
    fn cost(&self) -> Cost;
}

/// Refuse a config (`mode` of the file `path`) whose estimate passes [`MAX_OPS`] or the
/// machine's available memory.
pub fn check<C: Costed>(cfg: &C, path: &str, mode: &str) -> Result<()> {
    let c = cfg.cost();
    let (limit, source) = crate::memory::budget(None);
    // A NaN estimate (a size past f64's range times 0) is refused as too large.
    let too_slow = c.ops.is_nan() || c.ops > MAX_OPS;
    let too_big = limit > 0 && (c.bytes.is_nan() || c.bytes > limit as f64);
    if !too_slow && !too_big {
        return Ok(());
    }
    let what = match (too_slow, too_big) {
        (true, true) => "more operations than an experiment runs and more memory than",
        (true, false) => "more operations than an experiment runs",
        _ => "more memory than",
    };
    Err(RaceError::Config {
        path: path.to_string(),
        msg: format!(
            "`[{mode}]` asks for about {:.2e} operations and {} ({}), {what}{} (at most \
             {MAX_OPS:.0e} operations, {} memory); lower these sizes",
            c.ops,
            human(c.bytes),
            c.sizes,
            if too_big {
                format!(" {source}")
            } else {
                String::new()
            },
            crate::memory::human(limit),
        ),
    })
}

fn human(bytes: f64) -> String {
    if bytes.is_finite() && bytes < u64::MAX as f64 {
        crate::memory::human(bytes as u64)
    } else {
        "more bytes than a 64-bit count holds".to_string()
    }
}

/// `x` as f64.
fn u(x: usize) -> f64 {
    x as f64
}

/// `2^p` (infinite past f64's range, never wrapped).
fn two(p: usize) -> f64 {
    2f64.powf(u(p))
}

fn race(n: usize, l: usize, p: usize, d: usize, dv: usize) -> f64 {
    u(n) * u(l) * (u(p) * u(d) + two(p) * (u(dv) + 1.0))
}

fn pairs(n: usize, m: usize, w: f64) -> f64 {
    u(n) * u(m) * w
}

fn sum(xs: &[usize]) -> f64 {
    xs.iter().map(|&x| u(x)).sum()
}

fn max(xs: &[usize]) -> usize {
    xs.iter().copied().max().unwrap_or(0)
}

impl Costed for limit::Config {
    fn cost(&self) -> Cost {
        let (nq, nk) = (self.n_queries, self.n_keys);
        let ops: f64 = self
            .pl
            .iter()
            .map(|&[p, l]| {
                u(self.instances)
                    * ((u(nq) + u(nk)) * (u(l) * u(p)) * u(self.d)
                        + pairs(nq, nk, (u(l) * u(p)) + u(self.dv)) * u(self.xs.len()))
            })
            .sum();
        let lp = self
            .pl
            .iter()
            .map(|x| u(x[0]) * u(x[1]))
            .fold(0.0, crate::stats::nan_max);
        let rows = u(self.pl.len()) * u(self.instances) * u(nq) * (u(self.xs.len()) + 1.0);
        Cost {
            ops,
            bytes: 8.0 * (u(nq) + u(nk)) * ((u(self.d) + u(self.dv)) + lp) + 200.0 * rows,
            sizes: format!(
                "instances = {}, n_queries = {nq}, n_keys = {nk}, {} (P, L) points, {} exponents",
                self.instances,
                self.pl.len(),
                self.xs.len()
            ),
        }
    }
}

impl Costed for lemma10::Config {
    fn cost(&self) -> Cost {
        let gn = max(&self.grid_ns).max(self.n);
        let part1 =
            sum(&self.ls) * two(self.p) * u(self.d) + pairs(self.n, self.n, u(self.ls.len()));
        let per_n: f64 = self
            .grid_ns
            .iter()
            .map(|&n| {
                pairs(n, n, u(self.d))
                    + u(self.grid_seeds)
                        * sum(&self.grid_ls)
                        * u(n)
                        * two(self.grid_p)
                        * (u(self.d) + two(self.grid_p))
            })
            .sum();
        let grid = u(self.grid_betas.len()) * (u(self.n_theta) * QUAD + per_n);
        Cost {
            ops: part1 + grid,
            bytes: 8.0
                * (pairs(gn, gn, 2.0) + u(max(&self.grid_ls)) * two(self.grid_p) * u(gn) * 2.0),
            sizes: format!(
                "n = {}, grid_ns up to {}, {} grid betas × {} grid L × {} seeds, L up to {}",
                self.n,
                max(&self.grid_ns),
                self.grid_betas.len(),
                self.grid_ls.len(),
                self.grid_seeds,
                max(&self.ls).max(max(&self.grid_ls))
            ),
        }
    }
}

impl Costed for theorem::Config {
    fn cost(&self) -> Cost {
        let (d, dv) = (self.d, self.dv);
        let nb = u(self.betas.len());
        let bound: f64 = self
            .ns
            .iter()
            .map(|&n| {
                self.ps
                    .iter()
                    .map(|&p| {
                        (1.0 + nb) * pairs(n, n, u(d) + u(dv))
                            + u(self.seeds)
                                * nb
                                * self.ls.iter().map(|&l| race(n, l, p, d, dv)).sum::<f64>()
                    })
                    .sum::<f64>()
            })
            .sum();
        let instances = 2.0 * u(self.limit_seeds) + 5.0 * u(self.explicit_seeds) + 4.0;
        let lim = instances
            * u(self.ps.len())
            * u(self.limit_betas.len())
            * (pairs(self.limit_n, self.limit_n, u(d) + u(dv)) + u(self.n_theta) * QUAD);
        let n = max(&self.ns).max(self.limit_n);
        Cost {
            ops: bound + lim,
            bytes: 8.0 * u(n) * (2.0 * u(d) + 2.0 * u(dv)) * (nb + 3.0) * u(self.ps.len().max(1)),
            sizes: format!(
                "ns up to {}, {} P × {} L × {} betas × {} seeds; limit_n = {}, {} limit betas × {} seeds",
                max(&self.ns),
                self.ps.len(),
                self.ls.len(),
                self.betas.len(),
                self.seeds,
                self.limit_n,
                self.limit_betas.len(),
                self.limit_seeds
            ),
        }
    }
}

impl Costed for variance::Config {
    fn cost(&self) -> Cost {
        let (d, dv, p, s) = (self.d, self.dv, self.p, u(self.seeds));
        let by_l: f64 = self
            .ls
            .iter()
            .map(|&l| race(self.n_for_l, l, p, d, dv))
            .sum();
        let by_n: f64 = self
            .ns
            .iter()
            .map(|&n| race(n, self.l_for_n, p, d, dv))
            .sum();
        let exact = self
            .ns
            .iter()
            .chain([&self.n_for_l])
            .map(|&n| pairs(self.sample_rows.min(n), n, u(d) + u(dv)))
            .sum::<f64>();
        let n = max(&self.ns).max(self.n_for_l);
        Cost {
            ops: s * (by_l + by_n + exact) + u(self.n_theta) * QUAD,
            bytes: 8.0 * u(n) * (u(d) + u(dv)) * 4.0 + 4.0 * u(n) * u(max(&self.ls)) * two(p),
            sizes: format!(
                "{} seeds, n_for_l = {}, L up to {}, ns up to {}",
                self.seeds,
                self.n_for_l,
                max(&self.ls),
                max(&self.ns)
            ),
        }
    }
}

impl Costed for rank::Config {
    fn cost(&self) -> Cost {
        let (n, nf) = (self.n_explicit, self.n_features);
        let ops: f64 = self
            .pl
            .iter()
            .map(|&[p, l]| {
                let lr = u(l) * two(p);
                // The explicit Ŝ and its SVD; the stacked features and theirs.
                pairs(n, n, lr) + u(n).powi(3) + u(nf) * lr * (lr + u(self.d))
            })
            .sum();
        let lr = self
            .pl
            .iter()
            .map(|&[p, l]| u(l) * two(p))
            .fold(0.0, crate::stats::nan_max);
        Cost {
            ops,
            bytes: 8.0 * (3.0 * pairs(n, n, 1.0) + 2.0 * u(nf) * lr),
            sizes: format!("n_explicit = {n}, n_features = {nf}, L·2^P up to {lr}"),
        }
    }
}

impl Costed for bias::Config {
    fn cost(&self) -> Cost {
        let tables = u(self.betas.len()) * u(self.n_theta) * QUAD;
        let grid = u(self.betas.len()) * u(self.ps.len()) * u(self.n_theta);
        let norms = u(self.norms.len()) * u(self.norm_betas.len()) * u(self.norm_theta) * QUAD;
        let mc = u(self.mc_points.len()) * u(self.mc_draws) * 16.0;
        Cost {
            ops: tables + grid + norms + mc,
            bytes: 8.0 * (u(self.betas.len()) + 1.0) * u(self.n_theta) * 4.0 + 200.0 * grid,
            sizes: format!(
                "{} betas × {} P × n_theta = {}, {} norms × {} betas × {}, {} Monte-Carlo draws × {} points",
                self.betas.len(),
                self.ps.len(),
                self.n_theta,
                self.norms.len(),
                self.norm_betas.len(),
                self.norm_theta,
                self.mc_draws,
                self.mc_points.len()
            ),
        }
    }
}

impl Costed for causal::Config {
    fn cost(&self) -> Cost {
        let (n, d, dv) = (self.n, self.d, self.dv);
        let runs: f64 = self
            .ls
            .iter()
            .map(|&l| 2.0 * race(n, l, self.p, d, dv))
            .sum();
        Cost {
            ops: u(self.seeds) * runs + 2.0 * pairs(n, n, u(d) + u(dv)) + u(self.n_theta) * QUAD,
            bytes: 8.0 * u(n) * (u(d) + u(dv)) * 8.0,
            sizes: format!("n = {n}, {} seeds, L up to {}", self.seeds, max(&self.ls)),
        }
    }
}

impl Costed for authors::Config {
    fn cost(&self) -> Cost {
        let (n, d, dv) = (self.n, self.d, self.dv);
        let inputs = u(self.heads) + u(self.synthetic);
        let per: f64 = self
            .ps
            .iter()
            .map(|&p| pairs(n, n, u(d) + u(dv)) + 4.0 * u(self.seeds) * race(n, self.l, p, d, dv))
            .sum();
        Cost {
            ops: inputs * u(self.ts.len()) * per + u(self.fit_betas.len()) * QUAD * 1024.0,
            bytes: 8.0 * u(n) * (u(d) + u(dv)) * 8.0,
            sizes: format!(
                "{} heads + {} synthetic inputs × {} temperatures × {} P × {} seeds, n = {n}, L = {}",
                self.heads,
                self.synthetic,
                self.ts.len(),
                self.ps.len(),
                self.seeds,
                self.l
            ),
        }
    }
}

impl Costed for combine::Config {
    fn cost(&self) -> Cost {
        let (n, d, dv) = (self.n, self.d, self.dv);
        let runs: f64 = self
            .pl
            .iter()
            .map(|&[p, l]| 2.0 * race(n, l, p, d, dv))
            .sum();
        Cost {
            ops: u(self.betas.len()) * u(self.seeds) * runs
                + u(self.pl.len()) * pairs(n, n, u(d) + u(dv)),
            bytes: 8.0 * u(n) * (u(d) + u(dv)) * 8.0,
            sizes: format!(
                "n = {n}, {} (P, L) × {} betas × {} seeds",
                self.pl.len(),
                self.betas.len(),
                self.seeds
            ),
        }
    }
}

impl Costed for tradeoff::Config {
    fn cost(&self) -> Cost {
        let (n, d, dv) = (self.n, self.d, self.dv);
        let grid = |n: usize| -> f64 {
            self.ps
                .iter()
                .map(|&p| self.ls.iter().map(|&l| race(n, l, p, d, dv)).sum::<f64>())
                .sum()
        };
        let sweep = u(self.betas.len()) * u(self.seeds) * grid(n);
        let eval =
            u(self.eval_seeds) * (grid(n) + u(self.performer_scales.len()) * race(n, 1, 8, d, dv));
        let time = u(self.time_runs) * grid(self.time_n);
        let exact = (1.0 + u(self.ps.len())) * pairs(n, n, u(d) + u(dv));
        Cost {
            ops: sweep + eval + time + exact,
            bytes: 8.0 * u(n) * (u(d) + u(dv)) * 8.0
                + 4.0
                    * u(self.time_n)
                    * ((2.0 * u(d) + u(dv)) + 2.0 * two(max(&self.ps)) * u(max(&self.ls))),
            sizes: format!(
                "n = {n}, {} P × {} L × {} betas × {} seeds, {} evaluation seeds, time_n = {}",
                self.ps.len(),
                self.ls.len(),
                self.betas.len(),
                self.seeds,
                self.eval_seeds,
                self.time_n
            ),
        }
    }
}

impl Costed for fig3::Config {
    fn cost(&self) -> Cost {
        let n = self.n;
        let nd = pairs(n, n, u(self.d));
        let soft: f64 = self
            .soft
            .iter()
            .map(|&(p, l, _)| {
                let lr = u(l) * two(p);
                pairs(n, n, lr) * (1.0 + sum(&self.convergence_ls) / u(l.max(1)))
            })
            .sum();
        let (hp, hl) = self.hard;
        Cost {
            ops: u(self.gammas.len()) * nd + soft + pairs(n, n, u(hl) * two(hp)),
            bytes: 8.0 * pairs(n, n, u(self.gammas.len()) + 2.0 * u(self.soft.len()) + 2.0),
            sizes: format!(
                "n = {n}, {} soft panels with L up to {}, convergence L up to {}",
                self.soft.len(),
                self.soft.iter().map(|x| x.1).max().unwrap_or(0),
                max(&self.convergence_ls)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::parse_config;

    /// Every built-in config, quick and full, stays below a tenth of [`MAX_OPS`] and fits in
    /// 4 GiB: the estimate never refuses what `reproduce` runs.
    #[test]
    fn the_built_in_configs_are_well_within_the_limits() {
        fn both<C: serde::de::DeserializeOwned + Costed>(
            text: &str,
            name: &str,
        ) -> Vec<(String, Cost)> {
            let m = parse_config::<C>(text, name).expect("the built-in config reads");
            vec![
                (format!("{name} quick"), m.quick.expect("[quick]").cost()),
                (format!("{name} full"), m.full.expect("[full]").cost()),
            ]
        }
        let all = [
            both::<limit::Config>(include_str!("../../experiments/limit.toml"), "limit"),
            both::<lemma10::Config>(include_str!("../../experiments/lemma10.toml"), "lemma10"),
            both::<theorem::Config>(include_str!("../../experiments/theorem.toml"), "theorem"),
            both::<variance::Config>(include_str!("../../experiments/variance.toml"), "variance"),
            both::<rank::Config>(include_str!("../../experiments/rank.toml"), "rank"),
            both::<bias::Config>(include_str!("../../experiments/bias.toml"), "bias"),
            both::<causal::Config>(include_str!("../../experiments/causal.toml"), "causal"),
            both::<authors::Config>(include_str!("../../experiments/authors.toml"), "authors"),
            both::<combine::Config>(include_str!("../../experiments/combine.toml"), "combine"),
            both::<tradeoff::Config>(include_str!("../../experiments/tradeoff.toml"), "tradeoff"),
            both::<fig3::Config>(include_str!("../../experiments/fig3.toml"), "fig3"),
        ];
        for (name, c) in all.iter().flatten() {
            println!("{name}: {:.2e} operations, {}", c.ops, human(c.bytes));
            assert!(c.ops <= MAX_OPS / 10.0, "{name}: {c:?}");
            assert!(c.bytes <= 4.0 * (1u64 << 30) as f64, "{name}: {c:?}");
        }
    }

    /// The sizes that hung or aborted are refused at load time, naming the sizes, and a
    /// size past f64's range (2^P with a huge P) too.
    #[test]
    fn configs_past_the_limits_are_refused_naming_their_sizes() {
        let base = include_str!("../../experiments/limit.toml");
        // The largest integer TOML holds: sums of sizes in usize would overflow (a panic
        // under overflow checks); the estimate is in f64.
        let huge = "9223372036854775807";
        for (key, value) in [
            ("instances", "1000000000000"),
            ("n_keys", "100000000"),
            ("n_keys", huge),
            ("n_queries", huge),
        ] {
            let text = base.replacen(&format!("\n{key} = "), &format!("\n{key} = {value}\n#"), 2);
            // Refused as it is read, naming the size.
            let e = parse_config::<limit::Config>(&text, "c.toml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("{key} = {value}")) && e.contains("operations"),
                "{key}: {e}"
            );
        }
        let text = include_str!("../../experiments/rank.toml").replacen(
            "\npl = [",
            "\npl = [[1000000, 1], ",
            2,
        );
        assert!(parse_config::<rank::Config>(&text, "c.toml").is_err());
        // The built-in full config passes the same check.
        let cfg = parse_config::<limit::Config>(base, "limit").unwrap();
        assert!(check(&cfg.full.expect("[full]"), "limit", "full").is_ok());
    }
}
