//! The engine conformance suite (`engine::testkit::suite`) run on
//! OP-HMEH: model runs, races, reopen and crash-reopen, and bad pools
//! refused untouched, with hmeh's own corruption list (`common/spec.rs`).

#[allow(unused_imports)]
mod common;

engine::conformance_suite!(common::HmehSubject);
