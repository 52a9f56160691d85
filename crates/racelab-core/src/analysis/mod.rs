//! Analysis tools: singular values and numerical rank (faer), error metrics, fits.

#![deny(missing_docs)]

pub mod metrics;
pub mod rank;
