# bench/proxy/lib.sh — what bench/proxy/run and bench/proxy/stale-race share:
# settings, cleanup, installing tools, the canned upstream, and starting forkd, nginx
# and HAProxy as reverse proxies in front of it, and the proxy floor (bench/floors/proxy.c, #23).
# Sourced, not run.
# shellcheck shell=bash

readonly SERVER_CPU=0
readonly LOAD_CPU=1
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
readonly HERE ROOT

TMP=""
UPSTREAM_PID=""
UPSTREAM_PORT=""
declare -A PORT MASTER WORKER
declare -A RESULTS              # "server mode" -> µs/req of each round
declare -A KERNEL               # "server mode" -> kernel (stime) µs/req of each round
INVALID=0
ERRORS_SEEN=0

log() { printf '%s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

is_running() {
    local state
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}

stop_pid() {
    local pid=$1 sig=$2 i
    is_running "$pid" || return 0
    kill "-$sig" "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        is_running "$pid" || return 0
        sleep 0.1
    done
    log "warning: pid $pid ignored SIG$sig for 5 s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$? s
    trap - EXIT INT TERM
    for s in "${!MASTER[@]}"; do
        case $s in
            forkd) stop_pid "${MASTER[$s]}" INT ;;
            *) stop_pid "${MASTER[$s]}" TERM ;;
        esac
        [[ -n ${WORKER[$s]:-} ]] && stop_pid "${WORKER[$s]}" KILL
    done
    [[ -n $UPSTREAM_PID ]] && stop_pid "$UPSTREAM_PID" TERM
    wait 2>/dev/null || true
    if [[ -n $TMP && -d $TMP ]]; then
        if [[ $KEEP_TMP == 1 ]]; then log "kept temp dir $TMP"; else rm -rf -- "$TMP"; fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

has_server() { [[ " $SERVERS " == *" $1 "* ]]; }

check_args() {
    local s
    for s in $SERVERS; do
        [[ $s == forkd || $s == nginx || $s == haproxy || $s == floor ]] \
            || die "unknown server '$s' in SERVERS"
    done
}

check_cpus() {
    taskset -c "$SERVER_CPU,$LOAD_CPU" true 2>/dev/null \
        || die "need CPUs $SERVER_CPU and $LOAD_CPU in this process's affinity mask"
}

install_tools() {
    local pkgs=()
    command -v wrk >/dev/null || pkgs+=(wrk)
    command -v curl >/dev/null || pkgs+=(curl)
    command -v cc >/dev/null || pkgs+=(gcc libc6-dev)
    command -v taskset >/dev/null || pkgs+=(util-linux)
    command -v pgrep >/dev/null || pkgs+=(procps)
    export PATH="$PATH:/usr/sbin:/sbin"
    if has_server nginx && ! command -v nginx >/dev/null; then pkgs+=(nginx-light); fi
    if has_server haproxy && ! command -v haproxy >/dev/null; then pkgs+=(haproxy); fi
    if ((${#pkgs[@]})); then
        log "installing: ${pkgs[*]}"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2 \
            || die "apt-get install ${pkgs[*]} failed"
    fi
}

build_forkd() {
    if [[ -n $FORKD_BIN ]]; then
        [[ -x $FORKD_BIN ]] || die "FORKD_BIN=$FORKD_BIN is not executable"
        FORKD_BIN=$(realpath "$FORKD_BIN")
        return
    fi
    log "building forkd (release)..."
    (cd "$ROOT" && cargo build --release -p forkd >&2) || die "forkd failed to build"
    FORKD_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/forkd"
    [[ $FORKD_BIN == /* ]] || FORKD_BIN="$ROOT/$FORKD_BIN"
    [[ -x $FORKD_BIN ]] || die "build succeeded but $FORKD_BIN is missing"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

setup_tmp() {
    TMP=$(mktemp -d /tmp/forkd-bench-proxy.XXXXXX)
    chmod 755 "$TMP"
    # What the canned upstream sends: bytes 0..255 four times.
    python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 4)' >"$TMP/expected.bin"
}

# start_upstream [IDLE_MS]: the canned upstream; with IDLE_MS it closes connections
# idle that long.
start_upstream() {
    cc -O2 -o "$TMP/upstream" "$HERE/upstream.c" || die "bench/proxy/upstream.c failed to build"
    UPSTREAM_PORT=$(free_port)
    # shellcheck disable=SC2086  # no idle argument when empty
    taskset -c "$LOAD_CPU" "$TMP/upstream" "$UPSTREAM_PORT" ${1:-} >"$TMP/upstream.log" 2>&1 &
    UPSTREAM_PID=$!
    local i
    for ((i = 0; i < 100; i++)); do
        grep -q ready "$TMP/upstream.log" 2>/dev/null && break
        is_running "$UPSTREAM_PID" || die "the canned upstream exited: $(cat "$TMP/upstream.log")"
        sleep 0.05
    done
    curl -sf --max-time 2 "http://127.0.0.1:$UPSTREAM_PORT/" | cmp -s - "$TMP/expected.bin" \
        || die "the canned upstream does not answer correctly"
    log "canned upstream on port $UPSTREAM_PORT (pid $UPSTREAM_PID, CPU $LOAD_CPU)"
}

# fill_template FILE OUT: replaces @TMP@, @PORT@, @UPSTREAM_PORT@, @CPUMASK@.
fill_template() {
    sed -e "s|@TMP@|$TMP|g" -e "s|@PORT@|$2|g" -e "s|@UPSTREAM_PORT@|$UPSTREAM_PORT|g" \
        -e "s|@CPUMASK@|$((1 << SERVER_CPU))|g" "$1" >"$3"
}

show_logs() {
    local f
    for f in "$TMP/$1"-*.log; do
        [[ -s $f ]] || continue
        log "---- $f (last 20 lines) ----"
        tail -n 20 "$f" >&2
    done
}

# wait_ready SERVER STARTED_PID WORKER_IS_CHILD: until the proxied body is right and
# (for master/worker servers) the master has exactly one child.
wait_ready() {
    local s=$1 started=$2 child=$3 url="http://127.0.0.1:${PORT[$1]}/" i kids
    for ((i = 0; i < 200; i++)); do
        is_running "$started" || { log "error: $s exited during startup"; show_logs "$s"; return 1; }
        if curl -sf -o /dev/null --max-time 1 "$url"; then
            if [[ $child == 0 ]]; then
                MASTER[$s]=$started WORKER[$s]=$started
                break
            fi
            kids=$(pgrep -P "$started" || true)
            if [[ -n $kids && $kids != *$'\n'* ]]; then
                MASTER[$s]=$started WORKER[$s]=$kids
                break
            fi
        fi
        sleep 0.05
    done
    [[ -n ${WORKER[$s]:-} ]] || { log "error: $s not ready after 10 s at $url"; show_logs "$s"; return 1; }
    if ! curl -sf --max-time 2 "$url" | cmp -s - "$TMP/expected.bin"; then
        log "error: $s does not proxy the upstream's body correctly ($url)"
        show_logs "$s"; return 1
    fi
    local allowed
    allowed=$(awk '/^Cpus_allowed_list/ {print $2}' "/proc/${WORKER[$s]}/status")
    [[ $allowed == "$SERVER_CPU" ]] || log "WARNING: $s worker ${WORKER[$s]} runs on CPUs '$allowed'"
    log "$s ready on port ${PORT[$s]}: worker ${WORKER[$s]} (CPUs $allowed)"
}

start_nginx() {
    local m
    PORT[nginx]=$(free_port)
    mkdir -p "$TMP/nginx-tmp"
    : >"$TMP/nginx-temp-paths.conf"
    echo "client_body_temp_path $TMP/nginx-tmp/body;" >>"$TMP/nginx-temp-paths.conf"
    for m in proxy fastcgi uwsgi scgi; do
        nginx -V 2>&1 | grep -q -- "--without-http_${m}_module" \
            || echo "${m}_temp_path $TMP/nginx-tmp/$m;" >>"$TMP/nginx-temp-paths.conf"
    done
    fill_template "$HERE/nginx.conf" "${PORT[nginx]}" "$TMP/nginx.conf"
    (trap - INT QUIT; cd "$TMP" && exec nginx -p "$TMP/" -e "$TMP/nginx-error.log" -c "$TMP/nginx.conf") \
        >"$TMP/nginx-stdout.log" 2>&1 &
    MASTER[nginx]=$!
    wait_ready nginx "$!" 1
}

start_haproxy() {
    PORT[haproxy]=$(free_port)
    fill_template "$HERE/haproxy.cfg" "${PORT[haproxy]}" "$TMP/haproxy.cfg"
    # -db: foreground, one process (no master): the pid we start is the worker.
    (trap - INT QUIT; cd "$TMP" && exec taskset -c "$SERVER_CPU" haproxy -db -f "$TMP/haproxy.cfg") \
        >"$TMP/haproxy-stdout.log" 2>&1 &
    MASTER[haproxy]=$!
    wait_ready haproxy "$!" 0
}

# The proxy floor (bench/floors/proxy.c): one process, pinned like the proxies; the pid
# we start is the one whose CPU time is measured.
start_floor() {
    cc -O2 -Wall -Wextra -o "$TMP/floor" "$ROOT/bench/floors/proxy.c" || die "bench/floors/proxy.c failed to build"
    PORT[floor]=$(free_port)
    (trap - INT QUIT; exec taskset -c "$SERVER_CPU" "$TMP/floor" "${PORT[floor]}" "$UPSTREAM_PORT") \
        >"$TMP/floor-stdout.log" 2>&1 &
    MASTER[floor]=$!
    wait_ready floor "$!" 0
}

start_forkd() {
    PORT[forkd]=$(free_port)
    cat >"$TMP/forkd.ron" <<EOF2
(
    workers: Count(1),
    cpu_affinity: Auto,
    pid_file: "forkd.pid",
    shm_file: "forkd.shm",
    error_log: File("forkd-error.log"),
    log_level: Warn,
    upstreams: {
        "app": (servers: ["127.0.0.1:$UPSTREAM_PORT"], keepalive: 128, keepalive_requests: 100000),
    },
    servers: [(
        listen: ["127.0.0.1:${PORT[forkd]}"],
        access_log: None,
        keepalive_requests: 100000,
        routes: [(prefix: "/", handler: Proxy(upstream: "app"))],
    )],
)
EOF2
    (trap - INT QUIT; cd "$TMP" && exec "$FORKD_BIN" -c "$TMP/forkd.ron") >"$TMP/forkd-stdout.log" 2>&1 &
    MASTER[forkd]=$!
    wait_ready forkd "$!" 1
}

# cpu_split PID: its user and system ticks.
cpu_split() {
    sed 's/.*) //' "/proc/$1/stat" | awk '{print $12, $13}'
}

