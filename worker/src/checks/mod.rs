//! Active health checks and name re-resolution, run once for the whole daemon by
//! the worker holding the region's check lease (`shm::health`), read by every
//! worker.
//!
//! - [`probe`]: one check (a blocking `GET` bounded by its `timeout`).
//! - [`runner`]: the checks and resolver threads and the [`runner::Plan`] they follow.
//! - [`Checks`] (here): the event loop's side: publishes the plan when a
//!   configuration is adopted, and answers the proxy's two questions, [`usable`]
//!   (is a server Down by its checks?) and [`Checks::address`] (where does a server
//!   given by name live now?). Both cost a few atomic loads, no lock and no syscall.
//!
//! Why threads rather than sockets on the event loop: a check is rare (one per
//! server per interval, for the whole daemon) and `getaddrinfo` has no
//! non-blocking form, so a thread is needed for names anyway; blocking sockets with
//! timeouts keep a check a dozen lines, and the event loop's deadlines, budgets and
//! token space stay exactly as they were. The threads live in a worker, not in the
//! master: the master forks, and a child forked while another thread holds a lock
//! (the allocator's, the resolver's) can deadlock on it.
//!
//! [`usable`]: Checks::usable

pub mod probe;
pub mod runner;

use crate::stats::Stats;
use forkd_shared::config::{Config, UpstreamAddress};
use forkd_shared::shm::health::{self, HealthArea};
use forkd_shared::shm::upstream_state::{ActiveChecks, ActiveVerdict, UpstreamStateArea};
use runner::{Plan, Planned, Shared};
use std::net::SocketAddr;
use std::sync::Arc;

/// A server's cell and key in the health area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    cell: usize,
    key: u64,
}

/// The addresses this worker last read for a server given by name.
#[derive(Debug, Clone, Default)]
struct Followed {
    /// `health::key` of the server.
    key: u64,
    generation: u64,
    addrs: Vec<SocketAddr>,
    /// Round robin over `addrs` for new connections.
    next: usize,
}

/// The event loop's view of the health area.
pub struct Checks {
    area: &'static HealthArea,
    /// The servers' shared state: the checks start a returning server's ramp there.
    ramps: &'static UpstreamStateArea,
    shared: Arc<Shared>,
    started: bool,
    /// Draining: the threads were told to stop, and a later adoption must not
    /// restart them.
    stopped: bool,
    /// `slots[upstream][server]`: None when the server has no region cell.
    slots: Vec<Vec<Option<Slot>>>,
    /// Per upstream: it has a `health_check` (a verdict counts only then).
    checked: Vec<bool>,
    /// `names[upstream][server]`: Some for a server given by name.
    names: Vec<Vec<Option<Followed>>>,
}

impl Checks {
    pub fn new(area: &'static HealthArea, ramps: &'static UpstreamStateArea) -> Checks {
        Checks {
            area,
            ramps,
            shared: Shared::new(),
            started: false,
            stopped: false,
            slots: Vec::new(),
            checked: Vec::new(),
            names: Vec::new(),
        }
    }

    /// Maps `config`'s servers to their cells (after `stats.map_upstreams`) and
    /// publishes the plan the threads follow: call it whenever a configuration is
    /// adopted. Servers beyond the region's capacity are neither checked nor
    /// re-resolved (the master warns that they are not counted).
    pub fn adopt(&mut self, config: &Config, stats: &Stats) {
        let plan = self.map(config, stats);
        if self.stopped {
            return;
        }
        self.shared.set(plan);
        if !self.started && self.shared.has_work() {
            self.start();
        }
    }

    /// The mapping half of [`Checks::adopt`]: the servers' cells and names, and the
    /// plan for the threads (not published).
    fn map(&mut self, config: &Config, stats: &Stats) -> Plan {
        let mut plan = Plan::default();
        self.slots.clear();
        self.checked.clear();
        let old_names = std::mem::take(&mut self.names);
        for (u, up) in config.upstreams.iter().enumerate() {
            self.checked.push(up.health_check.is_some());
            let mut slots = Vec::with_capacity(up.servers.len());
            let mut names = Vec::with_capacity(up.servers.len());
            for (s, server) in up.servers.iter().enumerate() {
                let key = health::key(&up.name, &server.label);
                let slot = stats.upstream_cell(u, s).map(|c| Slot {
                    cell: c.index(),
                    key,
                });
                slots.push(slot);
                names.push(server.name.as_ref().map(|_| {
                    // A kept server keeps what it followed (the region's set may be
                    // newer than this configuration's resolution).
                    old_names
                        .iter()
                        .flatten()
                        .flatten()
                        .find(|f| f.key == key)
                        .cloned()
                        .unwrap_or(Followed {
                            key,
                            generation: u64::MAX,
                            addrs: server.resolved.clone(),
                            next: 0,
                        })
                }));
                if let Some(slot) = slot {
                    if up.health_check.is_some() || server.name.is_some() {
                        plan.servers.push(Planned {
                            cell: slot.cell,
                            key: slot.key,
                            upstream: up.name.clone(),
                            label: server.label.clone(),
                            addr: server.addr.clone(),
                            initial: server.resolved.clone(),
                            name: server.name.clone(),
                            check: up.health_check.clone(),
                            resolve_every: up.resolve_every,
                        });
                    }
                }
            }
            self.slots.push(slots);
            self.names.push(names);
        }
        plan
    }

    /// Starts the threads (once, after the worker dropped its privileges).
    fn start(&mut self) {
        match runner::start(&self.shared, self.area, self.ramps) {
            Ok(()) => self.started = true,
            Err(e) => forkd_shared::error!(
                "cannot start the upstream checks thread: {e}; another worker runs the checks"
            ),
        }
    }

    /// Draining: the threads give the lease up and end.
    pub fn stop(&mut self) {
        self.stopped = true;
        self.shared.stop();
    }

    #[inline]
    fn slot(&self, upstream: usize, server: usize) -> Option<Slot> {
        *self.slots.get(upstream)?.get(server)?
    }

    /// Whether client requests may go to `server` of `upstream`: false only when the
    /// upstream has checks and they say the server is Down.
    #[inline]
    pub fn usable(&self, upstream: usize, server: usize) -> bool {
        if !self.checked.get(upstream).copied().unwrap_or(false) {
            return true;
        }
        match self.slot(upstream, server) {
            Some(slot) => usable(self.area, slot.cell, slot.key),
            None => true,
        }
    }

    /// Bit i set: server i of `upstream` is Down by its checks (servers 0..64).
    pub fn down_mask(&self, upstream: usize) -> u64 {
        let count = self.slots.get(upstream).map_or(0, Vec::len).min(64);
        (0..count)
            .filter(|&s| !self.usable(upstream, s))
            .fold(0, |mask, s| mask | 1 << s)
    }

    /// The checks' verdicts on the servers of `upstream`, by region cell, for the
    /// balancer (`upstream_health::choose`), which weighs them with passive health.
    pub fn verdicts(&self, upstream: usize) -> Verdicts<'_> {
        Verdicts {
            checks: self,
            upstream,
        }
    }

    /// Reads the published address set of a server given by name if it changed
    /// since the last look; returns the new set then (once per change), for the
    /// caller to retire pooled connections to addresses no longer in it.
    pub fn refresh(&mut self, upstream: usize, server: usize) -> Option<Vec<SocketAddr>> {
        let slot = self.slot(upstream, server)?;
        let followed = self.names.get_mut(upstream)?.get_mut(server)?.as_mut()?;
        let cell = &self.area.cells[slot.cell];
        if cell.key.load(std::sync::atomic::Ordering::Acquire) != slot.key {
            return None; // not claimed by the owner yet: the configuration's set
        }
        if cell.addr_generation() == followed.generation {
            return None;
        }
        let (generation, addrs) = cell.addrs()?;
        followed.generation = generation;
        if addrs.is_empty() || addrs == followed.addrs {
            return None;
        }
        followed.addrs = addrs.clone();
        followed.next = 0;
        Some(addrs)
    }

    /// Where a new connection to `server` goes: for a server given by name, the next
    /// address of its current set (round robin); otherwise `configured`.
    pub fn address(
        &mut self,
        upstream: usize,
        server: usize,
        configured: &UpstreamAddress,
    ) -> UpstreamAddress {
        let followed = self
            .names
            .get_mut(upstream)
            .and_then(|u| u.get_mut(server))
            .and_then(Option::as_mut);
        match followed {
            Some(f) if !f.addrs.is_empty() => {
                let a = f.addrs[f.next % f.addrs.len()];
                f.next = f.next.wrapping_add(1);
                UpstreamAddress::Tcp(a)
            }
            _ => configured.clone(),
        }
    }
}

/// The active verdicts of one upstream's servers ([`Checks::verdicts`]).
pub struct Verdicts<'a> {
    checks: &'a Checks,
    upstream: usize,
}

impl ActiveChecks for Verdicts<'_> {
    /// `cell` is not needed: the server's slot holds its health cell and key.
    fn verdict(&self, server: usize, _cell: usize) -> ActiveVerdict {
        let c = self.checks;
        if !c.checked.get(self.upstream).copied().unwrap_or(false) {
            return ActiveVerdict::NotChecked;
        }
        match c.slot(self.upstream, server) {
            Some(slot) if usable(c.area, slot.cell, slot.key) => ActiveVerdict::Passing,
            Some(_) => ActiveVerdict::Failing,
            None => ActiveVerdict::NotChecked,
        }
    }
}

/// The hook a balancer calls: may client requests go to the server whose health
/// cell is `cell` and key `key` (`shm::health::key(upstream, label)`)?
#[inline]
pub fn usable(area: &HealthArea, cell: usize, key: u64) -> bool {
    area.cells.get(cell).is_none_or(|c| c.usable(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use forkd_shared::shm::health::{CheckError, Outcome};
    use forkd_shared::shm::master::claim_free_slot;
    use forkd_shared::shm::upstream::{config_labels, publish_labels};
    use forkd_shared::shm::Region;
    use std::rc::Rc;

    const CONFIG: &str = r#"(
        upstreams: {
            "app": (servers: ["127.0.0.1:9000", "127.0.0.1:9001", "svc.test:9002"],
                    health_check: Some((path: "/healthz", rise: 1, fall: 1))),
            "plain": (servers: ["127.0.0.1:9100"]),
        },
        servers: [(listen: ["127.0.0.1:8080"], routes: [
            (prefix: "/api/", handler: Proxy(upstream: "app")),
        ])],
    )"#;

    /// What the event loop sees while another worker (played by the test) owns the
    /// checks and the resolver: Down servers are masked, a published address set
    /// is picked up once and used round robin.
    #[test]
    fn the_proxy_sees_the_owners_verdicts_and_addresses() {
        let (_tmp, region) = crate::test_region::region("checks");
        let first: std::net::SocketAddr = "10.0.0.1:9002".parse().unwrap();
        let resolve = move |_: &str, _: u16| Ok(vec![first]);
        let config =
            Config::parse_with(std::path::Path::new("/tmp/forkd.ron"), CONFIG, &resolve).unwrap();
        let l = region.layout();
        assert!(publish_labels(&l.upstreams, &config_labels(&config)).is_empty());
        let mut stats = Stats::new(region.clone(), claim_free_slot(l, 0, 1).unwrap());
        stats.map_upstreams(&config);
        let leaked: &'static Rc<Region> = Box::leak(Box::new(region.clone()));
        let mut checks = Checks::new(&leaked.layout().health, &leaked.layout().upstream_state);
        let plan = checks.map(&config, &stats);
        assert_eq!(
            plan.servers.len(),
            3,
            "app's servers; plain has no check or name"
        );
        assert!(plan.servers[2].name.is_some());

        // The owner claims the cells and records a failed check of 9001.
        for s in &plan.servers {
            l.health.cells[s.cell].claim(s.key, &s.initial);
        }
        assert_eq!(checks.down_mask(0), 0);
        let fail = Outcome {
            status: None,
            error: Some(CheckError::Connect),
        };
        l.health.cells[plan.servers[1].cell].record(fail, 1, 1, 5);
        assert_eq!(checks.down_mask(0), 0b010);
        assert!(!checks.usable(0, 1) && checks.usable(0, 0));
        assert!(usable(&l.health, plan.servers[0].cell, plan.servers[0].key));
        assert!(checks.usable(1, 0), "an upstream without checks");

        // The name moves to two new addresses.
        let configured = UpstreamAddress::Tcp(first);
        assert_eq!(checks.refresh(0, 2), None, "the configuration's set");
        assert_eq!(checks.address(0, 2, &configured), configured);
        let moved: Vec<std::net::SocketAddr> = vec![
            "10.0.0.2:9002".parse().unwrap(),
            "10.0.0.3:9002".parse().unwrap(),
        ];
        l.health.cells[plan.servers[2].cell].publish_addrs(&moved);
        assert_eq!(checks.refresh(0, 2), Some(moved.clone()));
        assert_eq!(checks.refresh(0, 2), None, "reported once");
        let picked: Vec<UpstreamAddress> =
            (0..3).map(|_| checks.address(0, 2, &configured)).collect();
        assert_eq!(
            picked,
            [moved[0], moved[1], moved[0]].map(UpstreamAddress::Tcp),
            "round robin over the set"
        );
        // A reload keeps what the worker followed.
        checks.map(&config, &stats);
        assert_eq!(checks.refresh(0, 2), None);
        let after = checks.address(0, 2, &configured);
        assert!(
            moved.iter().any(|a| UpstreamAddress::Tcp(*a) == after),
            "{after:?} is not of the followed set"
        );
    }
}
