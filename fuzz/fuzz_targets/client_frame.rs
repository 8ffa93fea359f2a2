//! See `herald_proto::fuzzing::client_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_proto::fuzzing::client_frame(data));
