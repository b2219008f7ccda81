//! The engine conformance suite (`engine::testkit::suite`) run on PASS:
//! model runs, races, reopen and crash-reopen, and bad pools refused
//! untouched, with PASS's own corruption list (`common/spec.rs`).

mod common;

engine::conformance_suite!(common::PassSubject);
