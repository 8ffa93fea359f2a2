//! See `herald_store::fuzzing::codec`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_store::fuzzing::codec(data));
