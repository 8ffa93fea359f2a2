//! See `herald_proto::fuzzing::centrifugo_protobuf`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| herald_proto::fuzzing::centrifugo_protobuf(data));
