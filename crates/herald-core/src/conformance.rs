//! Engine conformance scenarios, shared by every engine's tests.
