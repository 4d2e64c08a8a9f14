//! Worker exit codes: how a worker tells the master why it ended.

/// The worker finished normally (graceful or fast stop).
pub const OK: i32 = 0;
/// The worker could not initialise (bad user, cannot pin, cannot set up its loop):
/// respawning it would fail the same way, so the master does not.
pub const FATAL_INIT: i32 = 78; // EX_CONFIG from sysexits.h
/// The worker hit an error it cannot serve through (its event loop failed): the master
/// respawns it in its slot, as after a crash.
pub const CRASH: i32 = 70; // EX_SOFTWARE from sysexits.h
