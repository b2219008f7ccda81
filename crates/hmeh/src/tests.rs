//! White-box tests: crash states built by hand (torn slots, half-done
//! splits), checked against recovery.
