//! Sequence parallelism over ranks and the streaming scale mode ([`racelab_dist`]), with the
//! lab's scaling study on top ([`scaling`]: the fitted model and its figure).

pub use racelab_dist::*;
pub mod scaling;
