//! The `.npy` reader on arbitrary bytes (headers and data): an error or an array, never a
//! panic, an abort or a hang. `cargo +nightly fuzz run npy`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = racelab_core::io::parse_npy(data, "fuzz.npy");
    let _ = racelab_core::io::parse_npy_native(data, "fuzz.npy");
});
