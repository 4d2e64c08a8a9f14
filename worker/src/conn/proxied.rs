//! The client side of a proxied exchange: feeds the client's body to the
//! [`Session`](crate::proxy::session::Session), pumps the upstream socket, writes the
//! response to the client, and acts on each [`Step`]: which server next, a pooled or a
//! new connection, the connection back to its pool, an error page, the logs.
//!
//! Backpressure both ways comes from the session's bounded streams: the client is
//! read only while the request stream has room, the upstream only while the response
//! stream has room, and the response stream drains only as the client socket takes
//! it. `io.rs` calls [`advance`] from the connection's state machine and reads the
//! client socket when asked ([`Progress::ReadClient`]).

use super::dispatch;
use super::proxied_deadlines::note_client;
pub use super::proxied_deadlines::{deadlines, min_rate};
use crate::access_log;
use crate::busy::{Busy, RateWindow};
use crate::cache::fill::Plan;
use crate::cache::CacheStatus;
use crate::handlers::Outcome;
use crate::http::response::{Persistence, Status};
use crate::out::{Flush, Sink};
use crate::overload::admission::Admission;
use crate::proxy::response_head::ClientBody;
use crate::proxy::retry::Failure;
use crate::proxy::session::Step;
use crate::proxy::stream::{Intercepted, Why};
use crate::services::Services;
use crate::spool::{Mode, Spool};
use crate::stats::CellId;
use crate::timers::Micros;
use crate::tls::Transport;
use crate::upstream_health::{self, fail_policy, Choice};
use crate::upstreams::{Proxied, Transfer};
use forkd_shared::cache::index::counters as cache_counters;
use forkd_shared::shm::upstream_state::{usability, ActiveChecks, DownReason, Usability};
use std::io::{self, IoSlice};
use std::net::IpAddr;

/// What the connection does after [`advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Bytes moved: call again.
    Again,
    /// The exchange wants client body bytes and none are buffered: read the client.
    ReadClient,
    /// Wait for an event (either socket) or the deadline.
    Wait,
    /// The turn's write budget is spent.
    Budget,
    /// The response was written whole; `keep`: the client connection stays open.
    Finished { keep: bool },
    /// Nothing of a response was sent: an error page is queued; `keep`: the client's
    /// request was read whole and the connection stays open after the page (else it
    /// closes, lingering).
    Failed { keep: bool },
    /// The client left, or writing to it failed: close it.
    Close,
    /// A 101 was written whole (and logged): the connection becomes a tunnel over
    /// `Proxied::upgraded`, whose token stays registered.
    Upgraded,
    /// The upstream failed after part of the response was sent: close the client,
    /// which sees a truncated response.
    Truncated,
}

/// What a proxied exchange writes its response to: the client connection's
/// [`Transport`], or an HTTP/2 stream (`h2::stream`), which frames what it is given.
pub trait ClientStream: Sink {
    /// `Ok(0)`: the client has gone (closed its connection, or reset its stream).
    fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

impl ClientStream for Transport<'_> {
    fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Transport::peek(self, buf)
    }
}

/// The client connection's side of [`advance`].
pub struct Client<'a> {
    pub key: usize,
    pub stream: &'a mut dyn ClientStream,
    /// The connection's peer (for the error log; the access log names the client
    /// `real_ip_header` gave, `Proxied::client`).
    pub peer: IpAddr,
    /// The connection's last progress (reads and writes), for its timeouts.
    pub progress: &'a mut Micros,
}

/// Moves the exchange as far as both sockets allow.
pub fn advance(
    p: &mut Proxied,
    c: &mut Client,
    busy: &mut Busy,
    svc: &mut Services,
    budget: &mut u64,
) -> Progress {
    let progress = step(p, c, busy, svc, budget);
    note_client(p, busy, svc.clock.now_us);
    progress
}

/// One step of [`advance`].
fn step(
    p: &mut Proxied,
    c: &mut Client,
    busy: &mut Busy,
    svc: &mut Services,
    budget: &mut u64,
) -> Progress {
    // `100 Continue` (queued below) goes out before any response byte.
    if !busy.out.is_empty() {
        let mut sent = 0;
        let result = busy.out.flush(c.stream, &mut sent, *budget);
        *budget = budget.saturating_sub(sent);
        if sent > 0 {
            *c.progress = svc.clock.now_us;
            svc.stats.bytes_out(sent);
        }
        match result {
            Err(_) => return Progress::Close,
            Ok(Flush::Blocked) => return Progress::Wait,
            Ok(Flush::Budget) => return Progress::Budget,
            Ok(Flush::Done) => {}
        }
    }
    if std::mem::take(&mut p.client_hung_up) && !busy.has_input() && client_left(p, c) {
        return abandon(p, c.peer, svc);
    }
    // Body bytes already here go in first: with the head in one write, and a
    // request read whole is known to be so if no server answers.
    let mut moved = false;
    if p.session.wants_client_body() && busy.has_input() {
        match p
            .session
            .feed_client_body(&busy.inbuf[busy.in_start..busy.in_end])
        {
            Ok(n) => {
                busy.consume(n);
                moved = n > 0;
            }
            Err(step) => {
                // A badly framed (400) or too large (413) chunked body: nothing
                // after it can be trusted.
                let status = match step {
                    Step::Respond(status) => Status(status),
                    _ => Status::BAD_REQUEST,
                };
                forget_token(p, svc);
                busy.discard_input();
                return fail(p, busy, svc, status, false, &[]);
            }
        }
    }
    // With request buffering no server is chosen (nor a slot of it taken, nor a
    // place under the adaptive limit) before the body is here whole: a slow upload
    // costs the application nothing.
    if p.server.is_none() && !p.upstream_done && p.session.ready_to_send() {
        if p.upstream_started_at.is_none() {
            let now = svc.clock.precise_us();
            p.upstream_started_at = Some(now);
            match svc.overload.admit(p.upstream, p.priority, now) {
                Admission::Admit(ticket) => p.overload = ticket,
                // Over the upstream's adaptive limit: refused at once, never queued.
                Admission::Shed => {
                    let step = Step::Unavailable {
                        retry_after_secs: 1,
                    };
                    if let Some(done) = act(p, c, busy, svc, step) {
                        return done;
                    }
                }
            }
        }
        let step = next_server(p, c.key, svc);
        if let Some(done) = act(p, c, busy, svc, step) {
            return done;
        }
    }
    if std::mem::take(&mut p.fired) {
        let step = p.session.timed_out();
        if let Some(done) = act(p, c, busy, svc, step) {
            return done;
        }
    }
    if !p.upstream_done {
        let step = p.session.pump();
        if let Some(done) = act(p, c, busy, svc, step) {
            return done;
        }
    }
    observe(p, svc);
    if p.expect_continue && p.session.ready_for_body() {
        p.expect_continue = false;
        if p.head_at.is_none() {
            busy.out
                .bytes()
                .extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
            svc.stats.response(100, None);
            return Progress::Again;
        }
    }
    if let Some(progress) = write_client(p, c, svc, budget, &mut busy.rate) {
        return progress;
    }
    if p.truncated {
        return Progress::Truncated;
    }
    if p.upstream_done && p.upgraded.is_some() {
        account(p, svc);
        return Progress::Upgraded;
    }
    if p.upstream_done {
        let keep = finish(p, svc);
        return Progress::Finished { keep };
    }
    // Body bytes already read from the client, and room for them that the pump just
    // made (the stream was full when this step began): no event will tell of either,
    // since the upstream took all it was given and the client, its bytes read, sends
    // no more until forkd reads on. Fed in the next step (which takes at least one
    // byte: the stream has room), or the exchange stalls until `send_timeout`.
    if moved || p.session.wants_client_body() && busy.has_input() {
        return Progress::Again;
    }
    if p.session.wants_client_body() {
        return Progress::ReadClient;
    }
    Progress::Wait
}

/// Writes what the response has for the client. Straight from the session while the
/// client keeps up (head and body in one `writev`, as without buffering); once it
/// falls behind and buffering is on, what the upstream sent goes to the exchange's
/// spool (memory, then a temporary file) so the session reads the upstream on, and
/// the client is fed from the spool (`sendfile` from the file). Without buffering, to
/// a plain socket, a body relayed as is is spliced (upstream socket → pipe → client,
/// [`splice_client`]). `None`: nothing is left to write.
fn write_client(
    p: &mut Proxied,
    c: &mut Client,
    svc: &mut Services,
    budget: &mut u64,
    rate: &mut RateWindow,
) -> Option<Progress> {
    // Decided once the head is here (its `X-Accel-Buffering` may turn buffering on).
    if !p.buffering && p.spool.is_none() && p.head_at.is_some() && c.stream.sendfile_fd().is_some()
    {
        p.session.allow_splice();
    }
    let mut blocked = false;
    if let Some(spool) = p.spool.as_mut().filter(|s| !s.is_empty()) {
        if *budget == 0 {
            return Some(Progress::Budget);
        }
        match spool.write_to(c.stream, *budget) {
            Ok(w) => {
                blocked = w.blocked;
                if w.n > 0 {
                    wrote(p, c, svc, budget, rate, w.n);
                }
            }
            Err(_) => return Some(Progress::Close),
        }
    }
    let spooled = p.spooled();
    let [head, body] = p.session.client_output_parts();
    if head.is_empty() && body.is_empty() {
        if !spooled && !blocked && p.session.spliced_held() > 0 {
            return Some(splice_client(p, c, svc, budget, rate));
        }
        return match (spooled, blocked) {
            (false, _) => None,
            (true, true) => Some(Progress::Wait),
            (true, false) => Some(Progress::Budget),
        };
    }
    if !spooled && !blocked {
        if *budget == 0 {
            return Some(Progress::Budget);
        }
        // A head and the body bytes after it leave in one `writev`, within the budget.
        let mut allowed = usize::try_from(*budget).unwrap_or(usize::MAX);
        let head = &head[..head.len().min(allowed)];
        allowed -= head.len();
        let body = &body[..body.len().min(allowed)];
        let written = match (head.is_empty(), body.is_empty()) {
            (false, false) => c
                .stream
                .write_vectored(&[IoSlice::new(head), IoSlice::new(body)]),
            (false, true) => c.stream.write(head),
            _ => c.stream.write(body),
        };
        match written {
            Ok(0) => return Some(Progress::Close),
            Ok(n) => {
                p.session.client_wrote(n);
                wrote(p, c, svc, budget, rate, n);
                return Some(Progress::Again);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => blocked = true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Some(Progress::Again),
            Err(_) => return Some(Progress::Close),
        }
    }
    // The client is behind.
    if p.buffering {
        let spool = p
            .spool
            .get_or_insert_with(|| Spool::new(svc.temp.clone(), SPOOL_MEMORY, Mode::Fifo));
        let mut n = spool.push(head);
        if n == head.len() {
            n += spool.push(body);
        }
        if n > 0 {
            // The session has room again: it reads the upstream on.
            p.session.client_wrote(n);
            return Some(Progress::Again);
        }
    }
    Some(if blocked {
        Progress::Wait
    } else {
        Progress::Budget
    })
}

/// Writes what the session spliced into its pipe to the client socket (`splice`),
/// within the budget; counted as any write.
fn splice_client(
    p: &mut Proxied,
    c: &mut Client,
    svc: &Services,
    budget: &mut u64,
    rate: &mut RateWindow,
) -> Progress {
    if *budget == 0 {
        return Progress::Budget;
    }
    let Some(fd) = c.stream.sendfile_fd() else {
        return Progress::Close; // allowed only for a plain socket
    };
    let max = usize::try_from(*budget).unwrap_or(usize::MAX);
    match p.session.splice_to_client(fd, max) {
        Ok(0) => Progress::Close,
        Ok(n) => {
            wrote(p, c, svc, budget, rate, n);
            Progress::Again
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Progress::Wait,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Progress::Again,
        Err(_) => Progress::Close,
    }
}

/// Response bytes the client took buffered for it in memory before a temporary file.
const SPOOL_MEMORY: usize = 64 * 1024;

/// `n` bytes reached the client (counted in its rate window: `min_send_rate`).
fn wrote(
    p: &mut Proxied,
    c: &mut Client,
    svc: &Services,
    budget: &mut u64,
    rate: &mut RateWindow,
    n: usize,
) {
    p.sent += n as u64;
    rate.bytes += n as u64;
    *budget = budget.saturating_sub(n as u64);
    *c.progress = svc.clock.now_us;
    svc.stats.bytes_out(n as u64);
}

/// Acts on a step of the session; `Some` when `advance` returns that.
fn act(
    p: &mut Proxied,
    c: &mut Client,
    busy: &mut Busy,
    svc: &mut Services,
    mut step: Step,
) -> Option<Progress> {
    loop {
        step = match step {
            Step::Pending => return None,
            Step::NeedFreshConnection { server } => {
                // The stale pooled connection race says nothing of the server; but
                // if it was marked down meanwhile (it died: other requests found
                // out), the free retry goes to another server instead.
                log_failure(p, svc, true, false);
                forget_token(p, svc);
                if usable_now(p, server, svc) {
                    connect(p, c.key, server, svc)
                } else {
                    next_server(p, c.key, svc)
                }
            }
            Step::NeedNextServer => {
                log_failure(p, svc, true, true);
                forget_token(p, svc);
                next_server(p, c.key, svc)
            }
            Step::Respond(status) => {
                log_failure(p, svc, false, true);
                forget_token(p, svc);
                p.overload = None; // the upstream side ended: out of the group's count
                p.in_flight = None;
                // What follows a request read whole is the client's next request.
                let keep = p.client_keep_alive && p.session.client_body_read();
                if !keep {
                    busy.discard_input();
                }
                if let Some(done) = stale_on_error(p, busy, svc, keep) {
                    return Some(done);
                }
                return Some(fail(p, busy, svc, Status(status), keep, &[]));
            }
            Step::Unavailable { retry_after_secs } => {
                forget_token(p, svc);
                p.overload = None;
                p.in_flight = None;
                let keep = p.client_keep_alive && p.session.client_body_read();
                if !keep {
                    busy.discard_input();
                }
                if let Some(done) = stale_on_error(p, busy, svc, keep) {
                    return Some(done);
                }
                let mut digits = Vec::with_capacity(20);
                crate::http::response::push_decimal(&mut digits, retry_after_secs);
                let extra: [(&str, &[u8]); 1] = [("Retry-After", &digits)];
                let status = Status::SERVICE_UNAVAILABLE;
                return Some(fail(p, busy, svc, status, keep, &extra));
            }
            Step::CloseClient => {
                p.upstream_done_at = Some(svc.clock.precise_us());
                log_failure(p, svc, false, true);
                forget_token(p, svc);
                p.overload = None;
                p.in_flight = None;
                observe(p, svc);
                // The client sees a truncated response; it is logged as what it was.
                account(p, svc);
                p.upstream_done = true;
                p.truncated = true;
                return None;
            }
            Step::Upgraded { socket, rest } => {
                p.upstream_done = true;
                observe(p, svc);
                p.upgraded = Some((socket, rest));
                return None;
            }
            Step::Done { pool } => {
                p.upstream_done = true;
                p.upstream_done_at = Some(svc.clock.precise_us());
                p.in_flight = None;
                observe(p, svc);
                p.overload = None;
                match (pool, p.token.take(), p.server) {
                    (Some((socket, requests)), Some(token), Some((_, id))) if !svc.draining => {
                        let now = svc.clock.now_us;
                        svc.upstreams.put(id, socket, token, requests, now);
                    }
                    (_, token, _) => {
                        if let Some(token) = token {
                            svc.upstreams.forget(token);
                        }
                    }
                }
                if let Some(i) = p.session.take_intercepted() {
                    let keep = p.client_keep_alive && p.session.request_complete() && !svc.draining;
                    return Some(answer_intercepted(p, busy, svc, i, keep));
                }
                return None;
            }
        };
    }
}

/// The application failed (no response, or every server down) and the request's
/// cache entry is stale within `stale-if-error`: the entry answers instead of an
/// error page. `None`: no such entry.
fn stale_on_error(
    p: &mut Proxied,
    busy: &mut Busy,
    svc: &mut Services,
    keep: bool,
) -> Option<Progress> {
    let plan = p.session.take_cache_plan()?;
    if !plan.stale.as_ref().is_some_and(|s| s.if_error) {
        return None;
    }
    answer_from_cache(p, busy, svc, &plan, CacheStatus::Stale, keep)
}

/// The cache answers for the upstream's response (read whole): a 304 refreshed the
/// stale entry, or a 5xx within `stale-if-error`.
fn answer_intercepted(
    p: &mut Proxied,
    busy: &mut Busy,
    svc: &mut Services,
    i: Intercepted,
    keep: bool,
) -> Progress {
    let status = match i.why {
        Why::NotModified => {
            i.plan
                .refresh(&i.upstream_head, forkd_shared::cache::unix_now());
            CacheStatus::Revalidated
        }
        Why::StaleOnError => CacheStatus::Stale,
    };
    match answer_from_cache(p, busy, svc, &i.plan, status, keep) {
        Some(done) => done,
        // The entry went (evicted, purged) while the application was asked.
        None => fail(p, busy, svc, Status::BAD_GATEWAY, keep, &[]),
    }
}

/// Queues the answer from `plan`'s stale entry, counted and logged as the
/// exchange's response (`Progress::Failed`: an answer is queued in `busy.out`).
fn answer_from_cache(
    p: &mut Proxied,
    busy: &mut Busy,
    svc: &mut Services,
    plan: &Plan,
    status: CacheStatus,
    keep: bool,
) -> Option<Progress> {
    let stale = plan.stale.as_ref()?;
    let entry = plan.open_stale()?;
    let now = forkd_shared::cache::unix_now();
    let age = match status {
        // The file's header was refreshed: its age on arrival is the 304's.
        CacheStatus::Revalidated => entry.meta.age_at_store,
        _ => stale
            .meta
            .age_at_store
            .saturating_add(now.saturating_sub(stale.meta.stored)),
    };
    let fields = crate::cache::key::fields(&plan.request_head);
    let not_modified = crate::cache::hit::not_modified(&fields, &entry.meta);
    dispatch::ensure_out(&mut busy.out);
    let answer = crate::cache::hit::Answer {
        date: svc.clock.http_date(),
        age,
        persistence: Persistence::after(keep, p.http10),
        head_only: p.client.line.line().is_head(),
        not_modified,
    };
    let sent =
        crate::cache::hit::write(&mut busy.out, &plan.zone, &std::rc::Rc::new(entry), &answer);
    if status == CacheStatus::Stale {
        plan.zone.index().bump(cache_counters::STALE, 1);
    }
    p.cache_status = Some(status);
    p.cache_answer = Some((sent.status, sent.body_bytes));
    p.upstream_done = true;
    p.upstream_done_at.get_or_insert(svc.clock.precise_us());
    account(p, svc);
    Some(Progress::Failed { keep })
}

/// Starts an attempt on the server `upstream_health::choose` picks among those this
/// request has not tried (a pooled connection if it has one); none left: 502; every
/// server down: 503.
fn next_server(p: &mut Proxied, key: usize, svc: &mut Services) -> Step {
    p.in_flight = None;
    let Some(upstream) = svc.config.upstreams.get(p.upstream) else {
        return Step::Respond(502); // removed by a reload
    };
    let tried = p.session.exchange().tried();
    let Some(balancer) = svc.upstreams.balancers.get_mut(p.upstream) else {
        return Step::Respond(502);
    };
    let stats = &svc.stats;
    let choice = upstream_health::choose(
        balancer,
        upstream,
        |s| stats.upstream_cell(p.upstream, s).map(CellId::index),
        stats.upstream_state(),
        &svc.checks.verdicts(p.upstream),
        tried,
        p.client.hash_key,
        stats.monotonic_ms(svc.clock.now),
        &mut svc.upstreams.scratch,
    );
    let server = match choice {
        Choice::Server(s) => s,
        // The servers left are down: the last attempt's failure is the answer.
        Choice::NoneLeft => {
            let failure = p.session.last_failure();
            return Step::Respond(failure.map_or(502, crate::proxy::retry::status_for));
        }
        Choice::AllDown { retry_after_secs } => return Step::Unavailable { retry_after_secs },
    };
    let id = svc.upstreams.pools.server_id(p.upstream, server);
    p.server = Some((server, id));
    follow_addresses(p.upstream, server, svc);
    let now = svc.clock.now_us;
    let can_resend = p.session.can_resend();
    if let Some((socket, requests, token)) = svc.upstreams.take(id, now, key, can_resend) {
        begin_attempt(p, svc, token);
        count_attempt(p, svc, true);
        p.session.attach(server, socket, Some(requests));
        return p.session.pump();
    }
    connect(p, key, server, svc)
}

/// Whether `server` of the exchange's upstream may take a request now (not marked
/// down for every worker); a server the region does not count always may.
fn usable_now(p: &Proxied, server: usize, svc: &Services) -> bool {
    let Some(cell) = svc.stats.upstream_cell(p.upstream, server) else {
        return true;
    };
    let now_ms = svc.stats.monotonic_ms(svc.clock.now);
    let state = svc.stats.upstream_state().server(cell.index());
    let active = svc
        .checks
        .verdicts(p.upstream)
        .verdict(server, cell.index());
    usability(state.passive(now_ms), active) == Usability::Usable
}

/// Starts an attempt on `server` over a new connection.
fn connect(p: &mut Proxied, key: usize, server: usize, svc: &mut Services) -> Step {
    follow_addresses(p.upstream, server, svc);
    let Some(configured) = svc
        .config
        .upstreams
        .get(p.upstream)
        .and_then(|u| u.servers.get(server))
        .map(|s| &s.addr)
    else {
        return Step::Respond(502); // removed by a reload
    };
    let addr = svc.checks.address(p.upstream, server, configured);
    let id = svc.upstreams.pools.server_id(p.upstream, server);
    p.server = Some((server, id));
    p.in_flight = None;
    match svc.upstreams.connect(&addr, key) {
        Ok((socket, token)) => {
            begin_attempt(p, svc, token);
            count_attempt(p, svc, false);
            p.session.attach(server, socket, None);
            p.session.pump()
        }
        Err(e) => {
            p.failure_logged = false;
            p.session.connect_failed(server, &e)
        }
    }
}

/// A server given by name moved (its name resolves to a new set, published in the
/// region): idle pooled connections to addresses no longer in the set are retired.
fn follow_addresses(upstream: usize, server: usize, svc: &mut Services) {
    if let Some(addrs) = svc.checks.refresh(upstream, server) {
        let id = svc.upstreams.pools.server_id(upstream, server);
        svc.upstreams.retire_not_in(id, &addrs);
    }
}

fn begin_attempt(p: &mut Proxied, svc: &Services, token: usize) {
    p.in_flight = cell(p, svc).map(|c| svc.stats.begin_in_flight(c));
    p.token = Some(token);
    p.failure_logged = false;
    p.state_tag = None;
    p.state_since = svc.clock.now_us;
    p.upstream_progress = svc.clock.now_us;
}

/// The upstream server of the current attempt's stats cell.
fn cell(p: &Proxied, svc: &Services) -> Option<crate::stats::CellId> {
    let (server, _) = p.server?;
    svc.stats.upstream_cell(p.upstream, server)
}

/// An attempt goes out on a pooled (`reused`) or new connection.
fn count_attempt(p: &Proxied, svc: &Services, reused: bool) {
    if let Some(c) = cell(p, svc) {
        svc.stats.upstream_request(c);
        svc.stats.upstream_connection(c, reused);
    }
}

/// The session dropped its socket (closed): its token is free.
fn forget_token(p: &mut Proxied, svc: &mut Services) {
    if let Some(token) = p.token.take() {
        svc.upstreams.forget(token);
    }
}

/// Notes state changes (for the deadlines), progress and the response head.
fn observe(p: &mut Proxied, svc: &Services) {
    let now = svc.clock.now_us;
    let tag = std::mem::discriminant(&p.session.exchange().state);
    if p.state_tag != Some(tag) {
        p.state_tag = Some(tag);
        p.state_since = now;
        p.upstream_progress = now;
    }
    if p.session.take_progress() {
        p.upstream_progress = now;
    }
    if p.head_at.is_none() {
        if let Some(head) = p.session.response_head() {
            let now = svc.clock.precise_us();
            p.head_at = Some(now);
            p.status = Some(head.status);
            if let Some(said) = head.buffering {
                p.buffering = said;
            }
            if let Some(ticket) = p.overload.as_mut() {
                ticket.completed(now);
            }
            if let Some(c) = cell(p, svc) {
                svc.stats
                    .upstream_response(c, head.status, p.time_to_head_us());
                let now_ms = svc.stats.monotonic_ms(svc.clock.now);
                svc.stats
                    .upstream_state()
                    .server(c.index())
                    .record_success(now_ms);
            }
        }
    }
}

/// Logs the current attempt's failure once, with the upstream and server; `counts`:
/// it counts towards the server's `max_fails` (all but the stale pooled connection
/// race), which may mark it down for every worker.
fn log_failure(p: &mut Proxied, svc: &Services, retried: bool, counts: bool) {
    if p.failure_logged {
        return;
    }
    let Some(failure) = p.session.last_failure() else {
        return;
    };
    p.failure_logged = true;
    let upstream = svc.config.upstreams.get(p.upstream);
    if let (Some(c), Some(u), true) = (cell(p, svc), upstream, counts) {
        let now_ms = svc.stats.monotonic_ms(svc.clock.now);
        let state = svc.stats.upstream_state().server(c.index());
        let may_mark = u.servers.len() > 1;
        if state.record_failure(down_reason(failure), now_ms, fail_policy(u), may_mark) {
            let label = p
                .server
                .and_then(|(s, _)| u.servers.get(s))
                .map_or("?", |s| s.label.as_str());
            forkd_shared::warn!(
                "upstream {} {label}: marked down for {:?} after {} failure(s) within {:?} ({failure})",
                u.name,
                u.fail_timeout,
                u.max_fails,
                u.fail_timeout
            );
        }
    }
    if let Some(c) = cell(p, svc) {
        match failure {
            Failure::ConnectRefused | Failure::ConnectTimeout => {
                svc.stats.upstream_connect_error(c)
            }
            Failure::Timeout => svc.stats.upstream_timeout(c),
            _ => {}
        }
        if retried {
            svc.stats.upstream_retry(c);
        }
    }
    let upstream = svc.config.upstreams.get(p.upstream);
    let name = upstream.map_or("?", |u| u.name.as_str());
    let label = p
        .server
        .and_then(|(s, _)| upstream.and_then(|u| u.servers.get(s)))
        .map_or("?", |s| s.label.as_str());
    if retried {
        forkd_shared::warn!("upstream {name} {label}: {failure} (retrying)");
    } else {
        forkd_shared::error!("upstream {name} {label}: {failure}");
    }
}

/// Whether the client is gone: its connection reported a hang-up and nothing but
/// the end is left to read (a client that half-closes after sending a next request
/// still waits for its answers; the caller looks at its buffered input first).
/// Asked only while no body is read from the client: a close while its body is read
/// ends that read.
fn client_left(p: &Proxied, c: &mut Client) -> bool {
    if p.upstream_done || p.session.wants_client_body() {
        return false;
    }
    let mut byte = [0u8; 1];
    match c.stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// The client left before its response was complete: the exchange ends here, its
/// upstream connection is closed (never pooled: the response is still coming), and
/// the request is logged with status 499 (nginx's "client closed request"; the
/// connection's close counts it in `responses_499`).
pub fn abandon(p: &mut Proxied, peer: IpAddr, svc: &mut Services) -> Progress {
    forkd_shared::info!(
        "client {peer} closed its connection before the upstream's response was complete"
    );
    forget_token(p, svc);
    p.session.abandon();
    p.upstream_done = true;
    let latency = svc.clock.precise_us().saturating_sub(p.started);
    log_line(p, svc, 499, latency);
    Progress::Close
}

/// The client moved what forkd waited on it for (`Proxied::rated`) below its
/// server's minimum rate (`io.rs` judged the period): the exchange ends here, its
/// upstream connection closed, never pooled (with request buffering still under
/// way, none was ever opened). A body with nothing of the response sent yet is
/// answered 408, as nginx answers a slow body, and the connection then closes
/// (`Failed`); otherwise the response is counted and logged as what it was, and the
/// caller resets the connection (`Close`).
pub fn too_slow(p: &mut Proxied, busy: &mut Busy, svc: &mut Services) -> Progress {
    forget_token(p, svc);
    p.session.abandon();
    p.upstream_done = true;
    p.overload = None;
    p.in_flight = None;
    if p.rated == Some(Transfer::Body) && p.sent == 0 {
        busy.discard_input(); // the rest of the body, unread
        return fail(p, busy, svc, Status::REQUEST_TIMEOUT, false, &[]);
    }
    account(p, svc);
    Progress::Close
}

/// How a failure is named as the reason a server was marked down.
fn down_reason(failure: Failure) -> DownReason {
    match failure {
        Failure::ConnectRefused => DownReason::ConnectRefused,
        Failure::ConnectTimeout => DownReason::ConnectTimeout,
        Failure::Reset => DownReason::Reset,
        Failure::Timeout => DownReason::Timeout,
        Failure::BadResponse | Failure::BadBody => DownReason::BadResponse,
    }
}

/// Queues the error page for `status` with `extra` fields (counted and logged like
/// any error page); `keep`: the connection stays open after it.
fn fail(
    p: &mut Proxied,
    busy: &mut Busy,
    svc: &mut Services,
    status: Status,
    keep: bool,
    extra: &[(&str, &[u8])],
) -> Progress {
    let (server, peer, started) = (p.client_server, p.client.peer, p.started);
    let persistence = Persistence::after(keep, p.http10);
    dispatch::error_page_with(
        &mut busy.out,
        svc,
        status,
        server,
        peer,
        started,
        Some(p.client.line.line()),
        persistence,
        extra,
    );
    Progress::Failed { keep }
}

/// Counts and logs the response; says whether the client connection stays open.
fn finish(p: &mut Proxied, svc: &mut Services) -> bool {
    account(p, svc);
    let close = p.session.response_head().is_none_or(|h| h.client_close);
    p.client_keep_alive && !close && p.session.request_complete() && !svc.draining
}

/// Counts the response in the stats and writes its access-log line.
fn account(p: &Proxied, svc: &mut Services) {
    let status = p.cache_answer.map_or(p.status.unwrap_or(502), |(s, _)| s);
    let now = svc.clock.precise_us();
    let latency = now.saturating_sub(p.started);
    svc.stats.response(status, Some(latency));
    count_buffering(p, svc, now);
    log_line(p, svc, status, latency);
}

/// The buffering counters of an exchange that ended: its bodies held in memory or a
/// temporary file, fallbacks to streaming, how long the upstream was busy with it
/// and how long the client took after that; and the temporary files' counts.
/// Each is counted for the worker and, once a server was chosen, for that server (the
/// last attempt's).
fn count_buffering(p: &Proxied, svc: &Services, now: Micros) {
    use forkd_shared::shm::{counters, upstream_counters as uc};
    let stats = &svc.stats;
    let cell = p
        .server_index()
        .and_then(|s| stats.upstream_cell(p.upstream_index(), s));
    let bump = |worker, server, n| {
        stats.bump(worker, n);
        if let Some(cell) = cell {
            stats.upstream_bump(cell, server, n);
        }
    };
    for spool in [p.session.request_spool(), p.spool.as_ref()]
        .into_iter()
        .flatten()
    {
        if spool.used_file() {
            bump(counters::BODIES_ON_DISK, uc::BODIES_ON_DISK, 1);
        } else if spool.pushed() > 0 {
            bump(counters::BODIES_IN_MEMORY, uc::BODIES_IN_MEMORY, 1);
        }
        if spool.refused().is_some() && spool.pushed() > 0 {
            bump(counters::BUFFERING_FELL_BACK, uc::BUFFERING_FELL_BACK, 1);
        }
    }
    if let (Some(start), Some(done)) = (p.upstream_started_at, p.upstream_done_at) {
        bump(
            counters::UPSTREAM_HELD_US,
            uc::HELD_US,
            done.saturating_sub(start),
        );
        bump(
            counters::CLIENT_TRANSFER_US,
            uc::CLIENT_TRANSFER_US,
            now.saturating_sub(done),
        );
    }
    stats.temp_files(svc.temp.take_counts());
}

/// The exchange's access-log line, with `status`.
fn log_line(p: &Proxied, svc: &mut Services, status: u16, latency: u64) {
    if !svc.logs.enabled(p.client_server) {
        return;
    }
    let body_bytes = match p.session.response_head().map(|h| h.client_body) {
        _ if p.cache_answer.is_some() => p.cache_answer.map_or(0, |(_, n)| n),
        Some(ClientBody::Length(n)) => n.min(p.sent),
        Some(ClientBody::None) | None => 0,
        // Chunked or close-delimited: the bytes sent (nginx's $bytes_sent).
        Some(_) => p.sent,
    };
    let outcome = Outcome {
        status: Status(status),
        body_bytes,
        logged: true,
    };
    let label = p.server_index().and_then(|i| {
        svc.config.upstreams[p.upstream]
            .servers
            .get(i)
            .map(|srv| srv.label.clone())
    });
    let upstream = label.as_deref().map(|addr| access_log::UpstreamEntry {
        addr,
        status: p.upstream_status(),
        header_time_us: p.time_to_head_us(),
        response_time_us: p.upstream_time_us(),
        connect: if p.reused_connection() {
            access_log::UpstreamConnect::Reused
        } else {
            access_log::UpstreamConnect::New
        },
    });
    dispatch::log_entry(
        svc,
        p.client_server,
        p.client.peer,
        p.client.line.line(),
        &outcome,
        latency,
        Some(p.request_id()),
        upstream,
        p.cache_status,
    );
}
