//! Socket options nix does not wrap.

use std::io;
use std::os::fd::RawFd;

/// `TCP_DEFER_ACCEPT`: the kernel hands a connection to `accept` only once its first
/// data has arrived (or after about `seconds`), so the worker can read the request at
/// once instead of registering the connection and waiting for it.
pub fn set_defer_accept(fd: RawFd, seconds: i32) -> io::Result<()> {
    // SAFETY: `seconds` is a live c_int for the duration of the call and its size is
    // passed alongside; a bad descriptor is reported through the return value.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&seconds as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The accept queue of a listening socket: (connections waiting, the queue's limit),
/// from `TCP_INFO` (for a listener the kernel reports them as `unacked`/`sacked`).
pub fn listen_queue(fd: RawFd) -> io::Result<(u32, u32)> {
    // SAFETY: tcp_info is plain old data; zeroed is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are live for the call and `len` holds info's size; the
    // kernel writes at most `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok((info.tcpi_unacked, info.tcpi_sacked))
}

/// Attaches a classic BPF program to the `SO_REUSEPORT` group of `fd` that hands each
/// new connection to one of the group's first `count` sockets, at random. Sockets join
/// a group in `listen()` order and the master listens slot by slot, so the first
/// `count` are the current slots'; any after them (a reload's removed slots) get no new
/// connections and can be drained.
pub fn steer_reuseport(fd: RawFd, count: u32) -> io::Result<()> {
    // SKF_AD_OFF + SKF_AD_RANDOM: a pseudo-random u32 in the accumulator.
    const SKF_AD_RANDOM_LOAD: u32 = (-0x1000i32) as u32 + 56;
    let mut program = [
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: SKF_AD_RANDOM_LOAD,
        },
        libc::sock_filter {
            code: (libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: count.max(1),
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_A) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
    ];
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `program`, both alive for the call; the kernel copies
    // the program and checks it before attaching.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
