//! The engine conformance suite (`engine::testkit::suite`) run on level
//! hashing: model runs, races, reopen and crash-reopen, and bad pools
//! refused untouched, with level's own corruption list
//! (`common/spec.rs`).

mod common;

engine::conformance_suite!(common::LevelSubject);
