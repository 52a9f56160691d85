//! Every experiment's TOML config reader on arbitrary text: an error naming the file or a
//! config, never a panic, an abort or a hang. `cargo +nightly fuzz run config`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = racelab::experiments::registry::parse_configs(text);
    }
});
