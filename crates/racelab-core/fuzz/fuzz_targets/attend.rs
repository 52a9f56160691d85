//! racelab's public entry points (`attend_array`, the `Backend` contract on `CpuRace`,
//! `Planes`) on arbitrary shapes, layouts, P, L, β, planes and values: an error or a finite
//! result, never a crash (`fuzz/harness/attend.rs` decodes an input; the sizes are capped
//! there). `cargo +nightly fuzz run attend` (under AddressSanitizer, cargo-fuzz's default).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "../harness/attend.rs"]
mod harness;

fuzz_target!(|data: &[u8]| {
    let _ = harness::run(data);
});
