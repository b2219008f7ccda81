//! PASS (Peng, Xie, Siegel: *Persistent Spiral Storage*): work in
//! progress. This crate holds the spiral-storage address math the engine
//! will stand on — the logical → physical mapping (the paper's Algorithm
//! 1), the power table (its Algorithm 2, corrected) and the fused mapping
//! table — each checked against its exact definition. The engine itself
//! (segments, expansion, recovery) is not written yet and is not in the
//! registry. See `docs/engines/pass.md`.

pub mod spiral;
pub mod table;
