//! Session tickets every worker can open: sealed with AES-256-GCM (ring) under the
//! ticket keys the master keeps in the shared-memory region (`shm::tls_keys`), so
//! a client resumes on whichever worker it reaches next, and after a reload or a
//! binary upgrade. Tickets sealed under the previous key are still opened, for one
//! rotation period.
//!
//! A ticket is `key id (4 bytes) | nonce (12) | sealed session state | tag (16)`.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;
use std::sync::Mutex;

/// One ticket key: its id (written in front of each ticket) and secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TicketKey {
    pub id: u32,
    pub secret: [u8; 32],
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TicketKey({})", self.id) // never the secret
    }
}

struct Sealer {
    id: u32,
    key: LessSafeKey,
}

impl Sealer {
    fn new(k: &TicketKey) -> Sealer {
        Sealer {
            id: k.id,
            key: LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &k.secret).expect("32 bytes")),
        }
    }
}

#[derive(Default)]
struct Keys {
    current: Option<Sealer>,
    previous: Option<Sealer>,
    /// What was installed, to skip re-keying when nothing changed.
    installed: (Option<TicketKey>, Option<TicketKey>),
}

/// The worker's ticketer: keys installed by the event loop from the region.
pub struct Tickets {
    keys: Mutex<Keys>,
    /// Seconds a ticket is announced to be good for (the rotation period: after two
    /// periods its key is gone from every worker).
    lifetime: u32,
    rng: SystemRandom,
}

impl std::fmt::Debug for Tickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tickets")
    }
}

/// TLS 1.2 sessions resumed by id (clients without tickets) that a worker keeps: one
/// cache for the worker's lifetime, so a reload does not forget them.
pub const SESSION_CACHE: usize = 4096;

/// What tickets announce as their lifetime: one rotation period (a ticket's key is
/// still accepted for a period after it stops sealing new ones).
pub const LIFETIME_SECS: u32 = 12 * 3600;

const ID_LEN: usize = 4;
const TAG_LEN: usize = 16;

impl Tickets {
    pub fn new(lifetime: u32) -> Tickets {
        Tickets {
            keys: Mutex::new(Keys::default()),
            lifetime,
            rng: SystemRandom::new(),
        }
    }

    /// Installs the keys in force (from the region); no-op when unchanged.
    pub fn install(&self, current: Option<TicketKey>, previous: Option<TicketKey>) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if keys.installed == (current, previous) {
            return;
        }
        keys.current = current.as_ref().map(Sealer::new);
        keys.previous = previous.as_ref().map(Sealer::new);
        keys.installed = (current, previous);
    }
}

impl ProducesTickets for Tickets {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.lifetime
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let keys = self.keys.lock().ok()?;
        let sealer = keys.current.as_ref()?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(ID_LEN + NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&sealer.id.to_be_bytes());
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        let aad = Aad::from(sealer.id.to_be_bytes());
        sealer
            .key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), aad, &mut body)
            .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        if cipher.len() < ID_LEN + NONCE_LEN + TAG_LEN {
            return None;
        }
        let id = u32::from_be_bytes(cipher[..ID_LEN].try_into().ok()?);
        let nonce: [u8; NONCE_LEN] = cipher[ID_LEN..ID_LEN + NONCE_LEN].try_into().ok()?;
        let keys = self.keys.lock().ok()?;
        let sealer = [keys.current.as_ref(), keys.previous.as_ref()]
            .into_iter()
            .flatten()
            .find(|s| s.id == id)?;
        let mut body = cipher[ID_LEN + NONCE_LEN..].to_vec();
        let plain = sealer
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(id.to_be_bytes()),
                &mut body,
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: u32, b: u8) -> TicketKey {
        TicketKey {
            id,
            secret: [b; 32],
        }
    }

    #[test]
    fn a_ticket_opens_under_the_current_or_previous_key_only() {
        let a = Tickets::new(3600);
        a.install(Some(key(1, 7)), None);
        let t1 = a.encrypt(b"session one").unwrap();
        // Another worker with the same keys opens it.
        let b = Tickets::new(3600);
        b.install(Some(key(1, 7)), None);
        assert_eq!(b.decrypt(&t1).unwrap(), b"session one");
        // After one rotation it still opens; after two it does not.
        b.install(Some(key(2, 8)), Some(key(1, 7)));
        assert_eq!(b.decrypt(&t1).unwrap(), b"session one");
        let t2 = b.encrypt(b"two").unwrap();
        b.install(Some(key(3, 9)), Some(key(2, 8)));
        assert!(b.decrypt(&t1).is_none());
        assert_eq!(b.decrypt(&t2).unwrap(), b"two");
        // A tampered ticket does not open.
        let mut bad = t2.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(b.decrypt(&bad).is_none());
        // Without keys, no ticket is issued.
        assert!(Tickets::new(1).encrypt(b"x").is_none());
    }
}
