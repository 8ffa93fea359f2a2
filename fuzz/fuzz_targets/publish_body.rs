//! See `herald_proto::fuzzing::publish_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_proto::fuzzing::publish_body(data));
