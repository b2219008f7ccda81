//! The engine conformance suite (`engine::testkit::suite`) run on ROPHI:
//! model runs, races, reopen and crash-reopen, and bad pools refused
//! untouched, with ROPHI's own corruption list (`common/spec.rs`).

mod common;

engine::conformance_suite!(common::RophiSubject);
