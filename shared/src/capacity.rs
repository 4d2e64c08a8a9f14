//! How much the shared-memory region has room for: the numbers `shm` lays the region
//! out by and `config` checks a configuration against. They live here, below both,
//! so that neither module imports the other for them.

/// Worker slots in the region: live workers of every generation share them.
pub const MAX_SLOTS: usize = 256;

/// Upstream servers the region has a cell for (stats, health, in-flight counts), all
/// upstreams together: a configuration with more is refused.
pub const UPSTREAM_CELLS: usize = 64;
/// Longest upstream name the region's label table holds.
pub const UPSTREAM_NAME_BYTES: usize = 64;
/// Longest server label (the address as written) the label table holds.
pub const SERVER_LABEL_BYTES: usize = 184;

/// Addresses kept per server given by name (a health cell holds as many).
pub const MAX_RESOLVED: usize = 8;
