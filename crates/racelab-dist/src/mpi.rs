//! The MPI transport (cargo feature `mpi`, the `mpi` crate over the system's MPI library):
//! `MPI_Exscan` for the prefix scan, the same on a communicator with the ranks reversed for the
//! suffix scan (so neither is a difference of sums), `MPI_Allreduce` for the rest,
//! point-to-point messages for the gather to rank 0, and `MPI_Abort`.

use super::comm::Comm;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use std::sync::Mutex;

/// The communicators; dropped in field order, so the universe (MPI_Finalize) goes last.
struct Inner {
    /// `MPI_COMM_WORLD` split with the rank order reversed (for the suffix scan).
    reversed: SimpleCommunicator,
    world: SimpleCommunicator,
    _universe: Universe,
}

// SAFETY: MPI is initialised with `MPI_THREAD_SERIALIZED` (checked in `MpiComm::init`): any
// thread may call MPI as long as no two calls overlap, and every call goes through the
// `Mutex` that owns these handles.
unsafe impl Send for Inner {}

/// `MPI_COMM_WORLD` of this job.
pub struct MpiComm {
    inner: Mutex<Inner>,
    rank: usize,
    size: usize,
    version: String,
}

impl MpiComm {
    /// Initialise MPI (once per process). `None` when it was already initialised or the
    /// library cannot give serialized multi-threading.
    pub fn init() -> Option<MpiComm> {
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)?;
        if threading < mpi::Threading::Serialized {
            return None;
        }
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let key = (size - 1 - rank) as i32;
        let reversed = world.split_by_color_with_key(Color::with_value(0), key)?;
        let version = mpi::environment::library_version()
            .map(|v| v.split([',', '\n']).next().unwrap_or("").trim().to_string())
            .unwrap_or_else(|_| "MPI".into());
        Some(MpiComm {
            inner: Mutex::new(Inner {
                reversed,
                world,
                _universe: universe,
            }),
            rank,
            size,
            version,
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Inner) -> T) -> T {
        f(&self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// `x ← op` over `comm`'s exclusive prefix, zero on its first rank (where MPI leaves the
/// receive buffer undefined).
fn exscan(comm: &SimpleCommunicator, x: &mut [f64]) {
    let send = x.to_vec();
    comm.exclusive_scan_into(&send[..], x, SystemOperation::sum());
    if comm.rank() == 0 {
        x.iter_mut().for_each(|y| *y = 0.0);
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn exscan_sum(&self, x: &mut [f64]) {
        self.with(|c| exscan(&c.world, x));
    }
    fn exscan_sum_rev(&self, x: &mut [f64]) {
        self.with(|c| exscan(&c.reversed, x));
    }
    fn all_sum(&self, x: &mut [f64]) {
        let send = x.to_vec();
        self.with(|c| {
            c.world
                .all_reduce_into(&send[..], x, SystemOperation::sum())
        });
    }
    fn all_max(&self, x: &mut [u64]) {
        let send = x.to_vec();
        self.with(|c| {
            c.world
                .all_reduce_into(&send[..], x, SystemOperation::max())
        });
    }
    fn barrier(&self) {
        self.with(|c| c.world.barrier());
    }
    fn gather_to_root(&self, x: &[f32]) -> Option<Vec<Vec<f32>>> {
        self.with(|c| {
            if self.rank == 0 {
                let mut all = vec![x.to_vec()];
                for r in 1..self.size {
                    all.push(c.world.process_at_rank(r as i32).receive_vec::<f32>().0);
                }
                Some(all)
            } else {
                c.world.process_at_rank(0).send(x);
                None
            }
        })
    }
    fn abort(&self, code: i32) -> ! {
        // Not through the lock: a rank may abort while another of its threads holds it.
        SimpleCommunicator::world().abort(code)
    }
    fn transport(&self) -> String {
        format!("MPI, {} ranks ({})", self.size, self.version)
    }
}
