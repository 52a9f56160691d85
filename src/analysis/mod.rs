//! Analysis tools: singular values and numerical rank (faer), error metrics, fits.

pub mod metrics;
pub mod rank;
