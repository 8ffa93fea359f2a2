//! See `herald_redis::fuzzing::resp_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_redis::fuzzing::resp_decode(data));
