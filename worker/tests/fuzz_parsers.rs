//! Property tests ("fuzzing" on the stable toolchain) of the sans-io HTTP parsers:
//! random and mutated inputs, a fixed number of cases each so `cargo test` stays fast.
//! Each property is one a client could break: the same bytes split differently must be
//! read the same, a body never yields more than it declared, a path never leaves the
//! root. Longer runs: the `cargo fuzz` targets in `fuzz/` (nightly).
//!
//! A failure is shrunk and its seed saved under `proptest-regressions/`; the inputs
//! that found bugs are also kept as plain unit tests beside the code they fixed.

mod fuzz_parsers {
    pub mod chunked;
    pub mod mutate;
    pub mod path;
    pub mod range;
    pub mod request;
}

use proptest::test_runner::{Config, RngSeed};

/// `cases` cases from a fixed seed, so every run of the suite tries the same inputs
/// and a failure is reproduced by running it again. `PROPTEST_CASES` and
/// `PROPTEST_RNG_SEED` override both for a longer or different hunt.
pub fn config(cases: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(0x0066_6f72_6b64);
    }
    // Failures are kept as unit tests beside the code they fixed, not as seed files.
    config.failure_persistence = None;
    config
}
