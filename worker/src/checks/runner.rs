//! The two threads a worker runs for the daemon-wide upstream work, started once the
//! worker serves (after it dropped privileges) and only if its configuration has
//! checks or names:
//!
//! - the *checks* thread holds the region's lease (`shm::health::CheckLease`) or
//!   waits for it; while it holds it, it runs each server's due check (the servers
//!   due together are checked side by side on scoped threads, so one slow server
//!   delays no other by more than its `timeout`) and records the results;
//! - the *resolver* thread, while this worker holds the lease, resolves every
//!   server given by name each `resolve_every` and publishes a changed address set;
//!   a failure keeps the last good set and is logged once until it works again.
//!   It is a thread of its own because `getaddrinfo` may block for many seconds,
//!   which must delay neither the checks nor the lease's heartbeat.
//!
//! Both read the [`Plan`] the event loop publishes at every configuration it adopts
//! (so a reload changes the checks in place) and are woken when it changes.

use super::probe::{self, Target};
use forkd_shared::config::{resolve_name, HealthCheck, UpstreamAddress};
use forkd_shared::shm::health::{HealthArea, HealthCell, Lease, Outcome, Verdict, MAX_ADDRS};
use forkd_shared::shm::upstream_state::{ServerState, UpstreamStateArea};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// One upstream server the daemon-wide work is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub cell: usize,
    pub key: u64,
    pub upstream: String,
    pub label: String,
    pub addr: UpstreamAddress,
    /// The addresses the configuration was loaded with.
    pub initial: Vec<SocketAddr>,
    pub name: Option<(String, u16)>,
    pub check: Option<HealthCheck>,
    pub resolve_every: Duration,
}

/// What the threads do: the servers of the configuration in force, or stop.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub servers: Vec<Planned>,
    pub stop: bool,
}

impl Plan {
    fn has_work(&self) -> bool {
        self.servers
            .iter()
            .any(|s| s.check.is_some() || s.name.is_some())
    }

    /// How old the holder's heartbeat may get before another worker takes over:
    /// three of the shortest check intervals (the holder renews it at least once per
    /// round), never under 3s, and longer than a round of checks can take (every
    /// address of a name checked one after the other, each up to its `timeout`).
    fn stale_ms(&self) -> u64 {
        let checks = || self.servers.iter().filter_map(|s| s.check.as_ref());
        let shortest = checks()
            .map(|c| c.interval)
            .min()
            .unwrap_or(Duration::from_secs(1));
        let longest_round = checks()
            .map(|c| c.timeout * (MAX_ADDRS as u32 + 1))
            .max()
            .unwrap_or_default();
        (3 * shortest.as_millis() as u64)
            .max(3_000)
            .max(longest_round.as_millis() as u64)
    }

    /// How long the threads sleep at most between looks at the lease and the plan.
    fn poll(&self) -> Duration {
        Duration::from_millis(self.stale_ms() / 3).min(Duration::from_secs(1))
    }
}

/// The plan and the threads to wake when it changes.
pub struct Shared {
    plan: Mutex<Plan>,
    threads: Mutex<Vec<Thread>>,
}

impl Shared {
    pub fn new() -> Arc<Shared> {
        Arc::new(Shared {
            plan: Mutex::new(Plan::default()),
            threads: Mutex::new(Vec::new()),
        })
    }

    /// Publishes `plan` and wakes the threads.
    pub fn set(&self, plan: Plan) {
        let mut current = self.plan.lock().unwrap_or_else(|e| e.into_inner());
        if *current == plan {
            return;
        }
        *current = plan;
        drop(current);
        for t in self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            t.unpark();
        }
    }

    pub fn stop(&self) {
        let mut plan = self.plan();
        plan.stop = true;
        self.set(plan);
    }

    fn plan(&self) -> Plan {
        self.plan.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn has_work(&self) -> bool {
        self.plan().has_work()
    }
}

/// Starts both threads; `ramps`: the servers' shared state, whose `slow_start` ramp
/// a server back up by its checks starts.
pub fn start(
    shared: &Arc<Shared>,
    area: &'static HealthArea,
    ramps: &'static UpstreamStateArea,
) -> std::io::Result<()> {
    let s = shared.clone();
    let checks = std::thread::Builder::new()
        .name("forkd-checks".into())
        .spawn(move || run_checks(&s, area, ramps))?;
    let s = shared.clone();
    let resolver = std::thread::Builder::new()
        .name("forkd-resolve".into())
        .spawn(move || run_resolver(&s, area))?;
    let mut threads = shared.threads.lock().unwrap_or_else(|e| e.into_inner());
    threads.push(checks.thread().clone());
    threads.push(resolver.thread().clone());
    Ok(())
}

fn me() -> i32 {
    std::process::id() as i32
}

fn run_checks(shared: &Shared, area: &'static HealthArea, ramps: &'static UpstreamStateArea) {
    let mut held = false;
    // When each (server, check) is due next; a changed check is a new entry, due now.
    let mut due: HashMap<(u64, HealthCheck), Instant> = HashMap::new();
    loop {
        let plan = shared.plan();
        if plan.stop || !plan.has_work() {
            if held {
                area.lease.release(me());
                held = false;
                forkd_shared::info!("gave up running the upstream checks");
            }
            if plan.stop {
                return;
            }
            std::thread::park_timeout(Duration::from_secs(1));
            continue;
        }
        let now_ms = forkd_shared::shm::monotonic_ms();
        match area.lease.hold(
            me(),
            now_ms,
            plan.stale_ms(),
            forkd_shared::shm::process_alive,
        ) {
            Lease::Renewed => {}
            Lease::Taken { from } => {
                held = true;
                due.clear();
                if from == 0 {
                    forkd_shared::info!("running the upstream checks and name resolution");
                } else {
                    forkd_shared::notice!(
                        "took over the upstream checks and name resolution from pid {from}"
                    );
                }
            }
            Lease::Held(_) => {
                if held {
                    forkd_shared::notice!("another worker runs the upstream checks now");
                    held = false;
                }
                std::thread::park_timeout(plan.poll());
                continue;
            }
        }
        for s in &plan.servers {
            area.cells[s.cell].claim(s.key, &s.initial);
        }
        let now = Instant::now();
        due.retain(|(key, check), _| {
            plan.servers
                .iter()
                .any(|s| s.key == *key && s.check.as_ref() == Some(check))
        });
        let ready: Vec<&Planned> = plan
            .servers
            .iter()
            .filter(|s| {
                s.check
                    .as_ref()
                    .is_some_and(|c| due.get(&(s.key, c.clone())).is_none_or(|at| *at <= now))
            })
            .collect();
        std::thread::scope(|scope| {
            for s in &ready {
                let (cell, state) = (&area.cells[s.cell], ramps.server(s.cell));
                scope.spawn(move || check_server(s, cell, state));
            }
        });
        for s in &ready {
            if let Some(c) = &s.check {
                due.insert((s.key, c.clone()), now + c.interval);
            }
        }
        let next = due.values().min().copied();
        let wait = next
            .map_or(plan.poll(), |at| {
                at.saturating_duration_since(Instant::now())
            })
            .min(plan.poll());
        if !wait.is_zero() {
            std::thread::park_timeout(wait);
        }
    }
}

/// Checks every address of `s` (a name may have several): it passes when all pass.
/// Back up after `rise` passes, its `slow_start` ramp (in `state`) starts.
fn check_server(s: &Planned, cell: &HealthCell, state: &ServerState) {
    let Some(check) = &s.check else { return };
    let request = probe::request(check, &s.label);
    let outcome = match &s.addr {
        UpstreamAddress::Unix(path) => probe::run(&Target::Unix(path), check, &request),
        UpstreamAddress::Tcp(configured) => {
            let addrs = match cell.addrs() {
                Some((_, a)) if !a.is_empty() => a,
                _ => vec![*configured],
            };
            let mut last = None;
            for a in addrs {
                let o = probe::run(&Target::Tcp(a), check, &request);
                last = Some(o);
                if !o.passed() {
                    break;
                }
            }
            last.unwrap_or(Outcome {
                status: None,
                error: None,
            })
        }
    };
    let (before, after) = cell.record(outcome, check.rise, check.fall, forkd_shared::shm::now_ms());
    if before == after {
        return;
    }
    let why = match (outcome.status, outcome.error) {
        (Some(status), Some(_)) => format!("status {status}"),
        (None, Some(e)) => e.name().to_string(),
        (Some(status), None) => format!("status {status}"),
        (None, None) => String::new(),
    };
    if after == Verdict::Up && before == Verdict::Down {
        state.start_ramp(forkd_shared::shm::monotonic_ms());
    }
    match after {
        Verdict::Down => forkd_shared::warn!(
            "upstream \"{}\" server {} is down: {} failed check(s) of {} in a row, the last: {why}",
            s.upstream,
            s.label,
            check.fall,
            check.path
        ),
        Verdict::Up if before == Verdict::Down => forkd_shared::notice!(
            "upstream \"{}\" server {} is up again: {} passed check(s) of {} in a row",
            s.upstream,
            s.label,
            check.rise,
            check.path
        ),
        _ => {}
    }
}

fn run_resolver(shared: &Shared, area: &'static HealthArea) {
    let mut due: HashMap<u64, Instant> = HashMap::new();
    loop {
        let plan = shared.plan();
        if plan.stop {
            return;
        }
        if area.lease.holder() != Some(me()) {
            due.clear();
            std::thread::park_timeout(plan.poll());
            continue;
        }
        let now = Instant::now();
        due.retain(|key, _| plan.servers.iter().any(|s| s.key == *key));
        for s in &plan.servers {
            let Some((host, port)) = &s.name else {
                continue;
            };
            let cell = &area.cells[s.cell];
            if cell.key.load(std::sync::atomic::Ordering::Acquire) != s.key {
                continue; // not claimed yet by the checks thread
            }
            let at = *due.entry(s.key).or_insert(now + s.resolve_every);
            if at > now {
                continue;
            }
            resolve_server(s, host, *port, cell);
            due.insert(s.key, Instant::now() + s.resolve_every);
        }
        let wait = due
            .values()
            .min()
            .map_or(plan.poll(), |at| {
                at.saturating_duration_since(Instant::now())
            })
            .min(plan.poll());
        if !wait.is_zero() {
            std::thread::park_timeout(wait);
        }
    }
}

fn resolve_server(s: &Planned, host: &str, port: u16, cell: &HealthCell) {
    use std::sync::atomic::Ordering::Relaxed;
    let current = cell.addrs().map(|(_, a)| a).unwrap_or_default();
    match resolve_name(host, port) {
        Ok(set) => {
            cell.resolutions.fetch_add(1, Relaxed);
            cell.resolved_ms.store(forkd_shared::shm::now_ms(), Relaxed);
            if cell.resolve_failing.swap(0, Relaxed) != 0 {
                forkd_shared::notice!(
                    "upstream \"{}\" server {}: resolving it works again",
                    s.upstream,
                    s.label
                );
            }
            if set != current {
                cell.publish_addrs(&set);
                forkd_shared::notice!(
                    "upstream \"{}\" server {} now resolves to {}",
                    s.upstream,
                    s.label,
                    list(&set)
                );
            }
        }
        Err(why) => {
            cell.resolve_failures.fetch_add(1, Relaxed);
            if cell.resolve_failing.swap(1, Relaxed) == 0 {
                forkd_shared::warn!(
                    "upstream \"{}\" server {}: resolving it again failed ({why}); keeping {} until it works",
                    s.upstream,
                    s.label,
                    list(&current)
                );
            }
        }
    }
}

fn list(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
