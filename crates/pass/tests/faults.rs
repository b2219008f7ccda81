//! Faults at open and on a full file system (shared checks in
//! `engine::testkit::faults`): a refused writable open leaves the file
//! byte for byte as it was, a clean pool damaged after close is refused
//! with an error that points at `pmhash check`, and a full file system is
//! `Err(OutOfSpace)` with the engine still usable.

use engine::testkit::faults;

#[test]
fn refused_opens_leave_the_file_untouched() {
    faults::refused_opens_leave_the_file_untouched(&pmhash_pass::spec());
}

#[test]
fn full_file_system_is_out_of_space() {
    faults::full_file_system_is_out_of_space(&pmhash_pass::spec());
}
