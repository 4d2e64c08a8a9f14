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
    // Odd: writing. Already odd only after a master died mid-publish; it ends even.
    let seq = area.seq.load(Relaxed) | 1;
    area.seq.store(seq, Relaxed);
    std::sync::atomic::fence(Release);
    for (slot, b) in area.data.iter().zip(text.as_bytes()) {
        slot.store(*b, Relaxed);
    }
    area.len.store(text.len() as u64, Relaxed);
    area.path.set(path);
    area.generation.store(generation, Relaxed);
    area.publisher.store(publisher, Relaxed);
    area.seq.store(seq + 1, Release); // even: done
    Ok(())
}

/// Attempts a reader makes before giving up: a publish takes microseconds, and a worker
/// calls this from its event loop, so it never waits (it tries again next turn).
const ATTEMPTS: u32 = 64;

/// Reads the published snapshot. None when nothing was published yet, or when the area
/// stayed mid-write for [`ATTEMPTS`] readings (a master stopped or killed while
/// publishing): the caller tries again later, and the next publish repairs the count.
pub fn read(area: &SnapshotArea) -> Option<Snapshot> {
    for _ in 0..ATTEMPTS {
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
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::testing::TempRegion;
    use crate::shm::Region;

    #[test]
    fn a_snapshot_left_mid_write_reads_as_none_and_the_next_publish_repairs_it() {
        let tmp = TempRegion::new("snapshot");
        let region = Region::create(&tmp.0, 1, None).unwrap();
        let area = &region.layout().snapshot;
        publish(area, 1, 1, "/etc/forkd.ron", "(workers: Auto)").unwrap();
        assert_eq!(read(area).unwrap().generation, 1);
        // A master killed while publishing leaves the count odd.
        area.seq.store(area.seq.load(Relaxed) + 1, Release);
        assert_eq!(read(area), None);
        publish(area, 1, 2, "/etc/forkd.ron", "(workers: Count(2))").unwrap();
        assert_eq!(area.seq.load(Relaxed) % 2, 0);
        let s = read(area).unwrap();
        assert_eq!((s.generation, s.text.as_str()), (2, "(workers: Count(2))"));
    }
}
