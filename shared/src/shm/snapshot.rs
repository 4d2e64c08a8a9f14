//! The configuration snapshot: the master publishes the text of the configuration it
//! validated; workers read it, parse it the same way, and adopt it between requests.
//!
//! Publishing the text rather than a binary form keeps one parser and one validator
//! for both sides. The area is written only by the master, under a sequence count:
//! odd while writing, so a reader that saw an odd or changed count reads again.

use super::layout::{SnapshotArea, SNAPSHOT_BYTES};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// The snapshot a worker read: generation, config file path, text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub generation: u64,
    pub publisher: i32,
    pub path: String,
    pub text: String,
}

/// Why a snapshot could not be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    pub len: usize,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the configuration is {} bytes; at most {SNAPSHOT_BYTES} can be published to workers",
            self.len
        )
    }
}

/// Publishes `text` (read from `path`) as `generation`, by the master `publisher`.
pub fn publish(
    area: &SnapshotArea,
    publisher: i32,
    generation: u64,
    path: &str,
    text: &str,
) -> Result<(), TooLarge> {
    if text.len() > SNAPSHOT_BYTES {
        return Err(TooLarge { len: text.len() });
    }
    area.seq.fetch_add(1, Release); // odd: writing
    std::sync::atomic::fence(Release);
    for (slot, b) in area.data.iter().zip(text.as_bytes()) {
        slot.store(*b, Relaxed);
    }
    area.len.store(text.len() as u64, Relaxed);
    area.path.set(path);
    area.generation.store(generation, Relaxed);
    area.publisher.store(publisher, Relaxed);
    area.seq.fetch_add(1, Release); // even: done
    Ok(())
}

/// Reads the published snapshot; None when nothing was published yet.
pub fn read(area: &SnapshotArea) -> Option<Snapshot> {
    loop {
        let before = area.seq.load(Acquire);
        if before % 2 == 1 {
            std::thread::yield_now();
            continue;
        }
        let generation = area.generation.load(Relaxed);
        let publisher = area.publisher.load(Relaxed);
        let len = (area.len.load(Relaxed) as usize).min(SNAPSHOT_BYTES);
        let bytes: Vec<u8> = area.data[..len].iter().map(|b| b.load(Relaxed)).collect();
        let path = area.path.get();
        std::sync::atomic::fence(Acquire);
        if area.seq.load(Relaxed) != before {
            continue;
        }
        if generation == 0 {
            return None;
        }
        return Some(Snapshot {
            generation,
            publisher,
            path,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        });
    }
}
