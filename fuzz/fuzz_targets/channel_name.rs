//! See `herald_proto::fuzzing::channel_name`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_proto::fuzzing::channel_name(data));
