//! The `.npy` reader on arbitrary bytes (headers and data): an error or an array, never a
//! panic, an abort or a hang. `cargo +nightly fuzz run npy`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    racelab::io::fuzz_npy(data);
});
