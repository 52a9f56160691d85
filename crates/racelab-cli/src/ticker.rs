//! Elapsed time on stderr while a call that cannot report its own progress runs: after
//! [`FIRST`], the time so far every [`EVERY`] (on a terminal one line rewritten in place; when
//! stderr is a file or a pipe, one line per tick), and the total when it ends.

use std::io::{IsTerminal, Write};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Silence before the first tick: a call this short says nothing.
pub const FIRST: Duration = Duration::from_secs(5);
/// Between ticks.
pub const EVERY: Duration = Duration::from_secs(10);

/// Ticks on stderr until dropped.
pub struct Ticker {
    stop: Option<Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Start ticking for `what` (e.g. "attend: soft on cpu, N = 1048576"); `eta` is the
    /// predicted seconds when there is a prediction.
    pub fn start(what: String, eta: Option<f64>) -> Ticker {
        let (tx, rx) = channel::<()>();
        let handle = std::thread::spawn(move || {
            let t0 = Instant::now();
            let tty = std::io::stderr().is_terminal();
            let mut wait = FIRST;
            let mut ticked = false;
            while let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(wait) {
                wait = EVERY;
                ticked = true;
                let s = t0.elapsed().as_secs_f64();
                let left = eta
                    .map(|e| format!(" of about {}", racelab::attend::human_seconds(e)))
                    .unwrap_or_default();
                let line = format!(
                    "[racelab] {what}: {}{left} elapsed",
                    racelab::attend::human_seconds(s)
                );
                let mut err = std::io::stderr().lock();
                let _ = if tty {
                    write!(err, "\r{line}\x1b[K")
                } else {
                    writeln!(err, "{line}")
                };
                let _ = err.flush();
            }
            if ticked {
                let s = racelab::attend::human_seconds(t0.elapsed().as_secs_f64());
                let mut err = std::io::stderr().lock();
                let _ = if tty {
                    writeln!(err, "\r[racelab] {what}: done in {s}\x1b[K")
                } else {
                    writeln!(err, "[racelab] {what}: done in {s}")
                };
            }
        });
        Ticker {
            stop: Some(tx),
            handle: Some(handle),
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
