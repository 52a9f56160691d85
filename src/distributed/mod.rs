//! Sequence parallelism over ranks and the streaming scale mode ([`racelab_core::distributed`]),
//! with the lab's scaling study on top ([`scaling`]: the fitted model and its figure).

pub use racelab_core::distributed::*;
pub mod scaling;
