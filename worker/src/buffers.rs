//! Reusable byte buffers. A connection holds an input or output buffer only while it
//! has bytes in it; an idle keep-alive connection holds none, so ten thousand idle
//! clients cost their connection structs and nothing more.

pub struct BufferPool {
    free: Vec<Vec<u8>>,
    capacity: usize,
    max_free: usize,
    /// Input buffers are handed out full-length (zeroed once) so reads can fill them
    /// without touching uninitialised memory; output buffers are handed out empty.
    full_length: bool,
}

impl BufferPool {
    /// A pool of buffers of `capacity` bytes, keeping at most `max_free` spare ones.
    pub fn new(capacity: usize, max_free: usize) -> BufferPool {
        BufferPool {
            free: Vec::new(),
            capacity,
            max_free,
            full_length: false,
        }
    }

    /// A pool of buffers whose length is their capacity, for reading into.
    pub fn new_full_length(capacity: usize, max_free: usize) -> BufferPool {
        BufferPool {
            full_length: true,
            ..BufferPool::new(capacity, max_free)
        }
    }

    /// A buffer: empty with at least the pool's capacity, or (full-length pools)
    /// exactly the pool's capacity long.
    pub fn take(&mut self) -> Vec<u8> {
        match self.free.pop() {
            Some(buf) => buf,
            None if self.full_length => vec![0; self.capacity],
            None => Vec::with_capacity(self.capacity),
        }
    }

    /// Returns a buffer; buffers grown far past the pool's size are freed instead, so
    /// one large response does not pin memory for good.
    pub fn give(&mut self, mut buf: Vec<u8>) {
        if self.free.len() < self.max_free && buf.capacity() <= self.capacity * 4 {
            if !self.full_length {
                buf.clear();
            }
            self.free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_oversized_ones_dropped() {
        let mut pool = BufferPool::new(1024, 2);
        let mut a = pool.take();
        a.extend_from_slice(b"abc");
        let ptr = a.as_ptr();
        pool.give(a);
        let b = pool.take();
        assert!(b.is_empty());
        assert_eq!(b.as_ptr(), ptr);
        pool.give(Vec::with_capacity(1 << 20));
        assert!(pool.free.is_empty() || pool.free.iter().all(|v| v.capacity() <= 4096));
    }
}
