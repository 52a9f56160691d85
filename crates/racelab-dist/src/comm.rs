//! The collectives sequence-parallel RACE needs, behind one trait ([`Comm`]), and two
//! transports that need no MPI: [`Solo`] (one process) and [`ThreadComm`] (ranks as threads
//! of one process, for tests of the distributed algorithm in every build). The MPI transport
//! is `super::mpi::MpiComm` (cargo feature `mpi`).

use std::sync::{Arc, Barrier, Mutex};

/// A group of ranks and the collectives of the distributed soft-RACE operator. Every rank
/// calls the same collectives in the same order with buffers of the same length.
pub trait Comm {
    /// This rank, `0..size`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn size(&self) -> usize;
    /// `x ← Σ_{r < rank} x_r` elementwise (zero on rank 0): the exclusive prefix scan.
    fn exscan_sum(&self, x: &mut [f64]);
    /// `x ← Σ_{r > rank} x_r` elementwise (zero on the last rank): the exclusive suffix scan.
    fn exscan_sum_rev(&self, x: &mut [f64]);
    /// `x ← Σ_r x_r` elementwise on every rank.
    fn all_sum(&self, x: &mut [f64]);
    /// `x ← max_r x_r` elementwise on every rank.
    fn all_max(&self, x: &mut [u64]);
    /// Wait for every rank.
    fn barrier(&self);
    /// Rank 0 receives every rank's `x` (in rank order, its own first); the others get `None`.
    fn gather_to_root(&self, x: &[f32]) -> Option<Vec<Vec<f32>>>;
    /// End every rank of the job with exit code `code` (after this rank printed why).
    fn abort(&self, code: i32) -> !;
    /// The transport, for reports ("one process", "threads", the MPI library's version).
    fn transport(&self) -> String;
}

/// A borrowed group is the group.
impl<T: Comm + ?Sized> Comm for &T {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn size(&self) -> usize {
        (**self).size()
    }
    fn exscan_sum(&self, x: &mut [f64]) {
        (**self).exscan_sum(x)
    }
    fn exscan_sum_rev(&self, x: &mut [f64]) {
        (**self).exscan_sum_rev(x)
    }
    fn all_sum(&self, x: &mut [f64]) {
        (**self).all_sum(x)
    }
    fn all_max(&self, x: &mut [u64]) {
        (**self).all_max(x)
    }
    fn barrier(&self) {
        (**self).barrier()
    }
    fn gather_to_root(&self, x: &[f32]) -> Option<Vec<Vec<f32>>> {
        (**self).gather_to_root(x)
    }
    fn abort(&self, code: i32) -> ! {
        (**self).abort(code)
    }
    fn transport(&self) -> String {
        (**self).transport()
    }
}

/// One process: every collective is the identity on one rank.
#[derive(Debug, Clone, Copy, Default)]
pub struct Solo;

impl Comm for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn exscan_sum(&self, x: &mut [f64]) {
        x.iter_mut().for_each(|y| *y = 0.0);
    }
    fn exscan_sum_rev(&self, x: &mut [f64]) {
        x.iter_mut().for_each(|y| *y = 0.0);
    }
    fn all_sum(&self, _x: &mut [f64]) {}
    fn all_max(&self, _x: &mut [u64]) {}
    fn barrier(&self) {}
    fn gather_to_root(&self, x: &[f32]) -> Option<Vec<Vec<f32>>> {
        Some(vec![x.to_vec()])
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
    fn transport(&self) -> String {
        "one process".into()
    }
}

/// What the ranks of a [`ThreadComm`] group share: a barrier and one slot per rank.
struct Group {
    barrier: Barrier,
    f64s: Mutex<Vec<Vec<f64>>>,
    u64s: Mutex<Vec<Vec<u64>>>,
    f32s: Mutex<Vec<Vec<f32>>>,
}

/// One rank of a group of threads in this process (from [`thread_group`]). Each collective
/// posts the rank's buffer, waits for all, reads every buffer and waits again; sums run in
/// rank order. [`Comm::abort`] panics (the group is one process).
#[derive(Clone)]
pub struct ThreadComm {
    rank: usize,
    size: usize,
    group: Arc<Group>,
}

/// `size` ranks sharing one group; hand one to each thread.
pub fn thread_group(size: usize) -> Vec<ThreadComm> {
    let group = Arc::new(Group {
        barrier: Barrier::new(size),
        f64s: Mutex::new(vec![Vec::new(); size]),
        u64s: Mutex::new(vec![Vec::new(); size]),
        f32s: Mutex::new(vec![Vec::new(); size]),
    });
    (0..size)
        .map(|rank| ThreadComm {
            rank,
            size,
            group: group.clone(),
        })
        .collect()
}

impl ThreadComm {
    /// Every rank's `x`, in rank order.
    fn exchange<T: Clone>(&self, slots: &Mutex<Vec<Vec<T>>>, x: &[T]) -> Vec<Vec<T>> {
        slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] = x.to_vec();
        self.group.barrier.wait();
        let all = slots.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.group.barrier.wait();
        all
    }

    /// `x ← Σ_{r ∈ ranks} x_r`, summed in rank order.
    fn sum_over(&self, x: &mut [f64], ranks: impl Iterator<Item = usize>) {
        let all = self.exchange(&self.group.f64s, x);
        x.iter_mut().for_each(|y| *y = 0.0);
        for r in ranks {
            x.iter_mut().zip(&all[r]).for_each(|(y, v)| *y += v);
        }
    }
}

impl Comm for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn exscan_sum(&self, x: &mut [f64]) {
        self.sum_over(x, 0..self.rank);
    }
    fn exscan_sum_rev(&self, x: &mut [f64]) {
        self.sum_over(x, self.rank + 1..self.size);
    }
    fn all_sum(&self, x: &mut [f64]) {
        self.sum_over(x, 0..self.size);
    }
    fn all_max(&self, x: &mut [u64]) {
        let all = self.exchange(&self.group.u64s, x);
        for (i, y) in x.iter_mut().enumerate() {
            *y = all.iter().map(|a| a[i]).max().unwrap_or(0);
        }
    }
    fn barrier(&self) {
        self.group.barrier.wait();
    }
    fn gather_to_root(&self, x: &[f32]) -> Option<Vec<Vec<f32>>> {
        let all = self.exchange(&self.group.f32s, x);
        (self.rank == 0).then_some(all)
    }
    fn abort(&self, code: i32) -> ! {
        panic!("rank {} of a thread group aborted (code {code})", self.rank)
    }
    fn transport(&self) -> String {
        format!("{} threads of one process", self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each collective of a four-rank thread group against its definition.
    #[test]
    fn thread_collectives_match_their_definitions() {
        type Results = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<u64>);
        let out: Vec<Results> = std::thread::scope(|s| {
            let hs: Vec<_> = thread_group(4)
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let r = c.rank() as f64;
                        let mut a = vec![r + 1.0, 10.0 * r];
                        let (mut b, mut t) = (a.clone(), a.clone());
                        c.exscan_sum(&mut a);
                        c.exscan_sum_rev(&mut b);
                        c.all_sum(&mut t);
                        let mut m = vec![c.rank() as u64, 7 - c.rank() as u64];
                        c.all_max(&mut m);
                        (a, b, t, m)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want_pre = [[0.0, 0.0], [1.0, 0.0], [3.0, 10.0], [6.0, 30.0]];
        let want_suf = [[9.0, 60.0], [7.0, 50.0], [4.0, 30.0], [0.0, 0.0]];
        for (r, (a, b, t, m)) in out.iter().enumerate() {
            assert_eq!(a[..], want_pre[r]);
            assert_eq!(b[..], want_suf[r]);
            assert_eq!(t[..], [10.0, 60.0]);
            assert_eq!(m[..], [3, 7]);
        }
        let mut x = [1.0, 2.0];
        Solo.exscan_sum(&mut x);
        assert_eq!(x, [0.0, 0.0]);
    }
}
