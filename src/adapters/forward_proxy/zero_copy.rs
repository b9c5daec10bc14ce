//! Tunnel bytes moved between two TCP sockets by the kernel: `splice(2)`
//! from one socket into a pipe and from the pipe into the other socket, so
//! no byte is copied through user space (a relaying hop otherwise copies
//! every byte twice). A direction holds a pipe only while bytes flow: it
//! takes one when its socket turns readable and gives it back as soon as a
//! read would block, so an idle tunnel costs its two sockets and its task,
//! never a pipe. Pipes come from a small process-wide pool with a fixed
//! budget of descriptors; when the budget is spent, a direction copies
//! through a short-lived buffer instead, the way [`super::relay`] does.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;
use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags, fcntl, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Pipes alive at once, in use or pooled: the process's budget, two
/// descriptors each, kept for them in the listeners' reserve.
pub use crate::file_limit::MAX_PIPES;
/// A pipe holds this much before its reader must drain it (the kernel's
/// default is 64 KiB; larger takes fewer calls per MiB).
const PIPE_SIZE: usize = 256 * 1024;
/// The copy used without a pipe reads up to this much at once.
const COPY_SIZE: usize = 64 * 1024;

/// Which way bytes went: from the first socket given to [`relay`] to the
/// second, or back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    Forward,
    Back,
}

/// One end of a tunnel: its socket and bytes already read from it (by the
/// HTTP layer, past the head it parsed) that are still to be relayed.
pub struct End {
    pub socket: TcpStream,
    pub early: Bytes,
}

/// Relays between `a` and `b` until both directions have ended (each end
/// read shuts down the other socket's writing), calling `moved` with each
/// count written on; returns the bytes moved `(a to b, b to a)`. The first
/// error ends both directions.
pub async fn relay(a: End, b: End, moved: &(dyn Fn(Way, usize) + Sync)) -> io::Result<(u64, u64)> {
    relay_lingering(a, b, moved, None).await
}

/// As [`relay`], but once either direction has ended the other gets at
/// most `linger` more (none: until it ends too). A side that closed is
/// done with the tunnel; a peer that keeps its own side open must not
/// hold it (and what it holds, a lease) until the idle timeout.
pub async fn relay_lingering(
    a: End,
    b: End,
    moved: &(dyn Fn(Way, usize) + Sync),
    linger: Option<std::time::Duration>,
) -> io::Result<(u64, u64)> {
    let forward = one_way(&a.socket, a.early, &b.socket, |n| moved(Way::Forward, n));
    let back = one_way(&b.socket, b.early, &a.socket, |n| moved(Way::Back, n));
    let Some(linger) = linger else {
        return tokio::try_join!(forward, back);
    };
    tokio::pin!(forward, back);
    let rest = |r: Result<io::Result<u64>, tokio::time::error::Elapsed>| r.unwrap_or(Ok(0));
    tokio::select! {
        ended = &mut forward => {
            let forward = ended?;
            Ok((forward, rest(tokio::time::timeout(linger, &mut back).await)?))
        }
        ended = &mut back => {
            let back = ended?;
            Ok((rest(tokio::time::timeout(linger, &mut forward).await)?, back))
        }
    }
}

async fn one_way(from: &TcpStream, early: Bytes, to: &TcpStream, moved: impl Fn(usize)) -> io::Result<u64> {
    let mut total = write_all(to, &early).await?;
    if total > 0 {
        moved(early.len());
    }
    // It may share its allocation with the HTTP layer's whole read buffer.
    drop(early);
    loop {
        from.readable().await?;
        let flowed = match Pipe::take() {
            Some(pipe) => through_pipe(from, to, pipe, &moved).await?,
            None => through_buffer(from, to, &moved).await?,
        };
        match flowed {
            Flowed::Quiet(n) => total += n,
            Flowed::Ended(n) => {
                total += n;
                if let Err(e) = socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write)
                    && e.kind() != io::ErrorKind::NotConnected
                {
                    return Err(e);
                }
                return Ok(total);
            }
        }
    }
}

/// What one turn of a direction moved, and how it stopped.
enum Flowed {
    /// `from` had nothing more to read for now.
    Quiet(u64),
    /// `from` ended.
    Ended(u64),
}

/// Splices while `from` has bytes; the pipe goes back to the pool empty, or
/// is closed with the tunnel when an error leaves bytes in it.
async fn through_pipe(
    from: &TcpStream,
    to: &TcpStream,
    pipe: Pipe,
    moved: &impl Fn(usize),
) -> io::Result<Flowed> {
    let mut total = 0u64;
    loop {
        let read = from.try_io(Interest::READABLE, || {
            splice(from, None, &pipe.write, None, PIPE_SIZE, flags()).map_err(io::Error::from)
        });
        let mut held = match read {
            Ok(0) => {
                pipe.give_back();
                return Ok(Flowed::Ended(total));
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                pipe.give_back();
                return Ok(Flowed::Quiet(total));
            }
            Err(e) => return Err(e),
        };
        while held > 0 {
            to.writable().await?;
            let written = to.try_io(Interest::WRITABLE, || {
                splice(&pipe.read, None, to, None, held, flags()).map_err(io::Error::from)
            });
            match written {
                Ok(n) => {
                    held -= n;
                    total += n as u64;
                    moved(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// One read copied through a buffer, for when no pipe is free.
async fn through_buffer(from: &TcpStream, to: &TcpStream, moved: &impl Fn(usize)) -> io::Result<Flowed> {
    let mut buffer = vec![0u8; COPY_SIZE];
    let n = match from.try_read(&mut buffer) {
        Ok(0) => return Ok(Flowed::Ended(0)),
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flowed::Quiet(0)),
        Err(e) => return Err(e),
    };
    let written = write_all(to, &buffer[..n]).await?;
    moved(n);
    Ok(Flowed::Quiet(written))
}

async fn write_all(to: &TcpStream, mut bytes: &[u8]) -> io::Result<u64> {
    let total = bytes.len() as u64;
    while !bytes.is_empty() {
        to.writable().await?;
        match to.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

fn flags() -> SpliceFFlags {
    SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK
}

/// An empty pipe, ready to carry one burst.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

/// Pipes not in use.
static POOLED: Mutex<Vec<Pipe>> = Mutex::new(Vec::new());
/// Pipes alive, in use or pooled.
static ALIVE: AtomicUsize = AtomicUsize::new(0);

impl Pipe {
    /// A pooled pipe, or a new one within the budget; `None` past it or
    /// when the system has no descriptor to spare.
    fn take() -> Option<Self> {
        if let Some(pipe) = POOLED.lock().unwrap_or_else(PoisonError::into_inner).pop() {
            return Some(pipe);
        }
        if ALIVE.fetch_add(1, Ordering::AcqRel) >= MAX_PIPES {
            ALIVE.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        match nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC) {
            Ok((read, write)) => {
                // A smaller pipe (the limit lowered by the system) still works.
                let _ = fcntl(&write, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32));
                Some(Self { read, write })
            }
            Err(e) => {
                ALIVE.fetch_sub(1, Ordering::AcqRel);
                if e != Errno::EMFILE && e != Errno::ENFILE {
                    tracing::debug!(error = %e, "no pipe for a tunnel; copying through a buffer");
                }
                None
            }
        }
    }

    /// Back to the pool; only an empty pipe may come back.
    fn give_back(self) {
        POOLED.lock().unwrap_or_else(PoisonError::into_inner).push(self);
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        ALIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Two connected loopback sockets.
    async fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let connecting = TcpStream::connect(listener.local_addr().unwrap());
        let (accepted, connected) = tokio::join!(listener.accept(), connecting);
        (accepted.unwrap().0, connected.unwrap())
    }

    /// Writes `outgoing` and ends its side while reading all that comes.
    async fn send_and_take(mut stream: TcpStream, outgoing: Vec<u8>) -> Vec<u8> {
        let (mut r, mut w) = stream.split();
        let writing = async {
            w.write_all(&outgoing).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let ((), read) = tokio::join!(writing, r.read_to_end(&mut got));
        read.unwrap();
        got
    }

    /// The pool is process-wide: tests that judge it take turns.
    static POOL_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    #[tokio::test]
    async fn bytes_go_both_ways_whole_early_bytes_first_and_ends_pass_on() {
        let _turn = POOL_TESTS.lock().await;
        let (client, near) = socket_pair().await;
        let (far, site) = socket_pair().await;
        let up: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = (0..2_000_000u32).map(|i| (i % 241) as u8).collect();
        let counted = std::sync::Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let tally = counted.clone();
        let relayed = tokio::spawn(async move {
            let near = End {
                socket: near,
                early: Bytes::from_static(b"client-early:"),
            };
            let far = End {
                socket: far,
                early: Bytes::from_static(b"site-early:"),
            };
            relay(near, far, &|way, n| {
                tally[usize::from(way == Way::Back)].fetch_add(n as u64, Ordering::Relaxed);
            })
            .await
        });
        let client_side = tokio::spawn(send_and_take(client, up.clone()));
        let site_side = tokio::spawn(send_and_take(site, down.clone()));
        let at_site = site_side.await.unwrap();
        let at_client = client_side.await.unwrap();
        assert_eq!(&at_site[..13], b"client-early:");
        assert!(
            at_site[13..] == up[..],
            "the site got the client's bytes, in order"
        );
        assert_eq!(&at_client[..11], b"site-early:");
        assert!(
            at_client[11..] == down[..],
            "the client got the site's bytes, in order"
        );
        let (forward, back) = relayed.await.unwrap().unwrap();
        assert_eq!((forward, back), (up.len() as u64 + 13, down.len() as u64 + 11));
        assert_eq!(
            counted[0].load(Ordering::Relaxed),
            forward,
            "every byte reported as moved"
        );
        assert_eq!(counted[1].load(Ordering::Relaxed), back);
    }

    #[tokio::test]
    async fn a_quiet_tunnel_holds_no_pipe_and_a_reset_ends_the_relay() {
        let _turn = POOL_TESTS.lock().await;
        let (mut client, near) = socket_pair().await;
        let (far, mut site) = socket_pair().await;
        let relayed = tokio::spawn(async move {
            let ends = (
                End {
                    socket: near,
                    early: Bytes::new(),
                },
                End {
                    socket: far,
                    early: Bytes::new(),
                },
            );
            relay(ends.0, ends.1, &|_, _| {}).await
        });
        client.write_all(b"ping").await.unwrap();
        let mut got = [0u8; 4];
        site.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        // Quiet now: the pipe this tunnel used is back in the pool.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !POOLED.lock().unwrap().is_empty(),
            "the pipe went back to the pool when the burst ended"
        );
        // The site resets: the relay ends with an error, not a hang.
        socket2::SockRef::from(&site)
            .set_linger(Some(std::time::Duration::ZERO))
            .unwrap();
        drop(site);
        // (A reset may also read as an end of the site's bytes; either way
        // the relay returns.)
        tokio::time::timeout(std::time::Duration::from_secs(5), relayed)
            .await
            .expect("the relay ended after the reset")
            .unwrap()
            .ok();
    }

    #[tokio::test]
    async fn without_a_free_pipe_bytes_are_copied_through_a_buffer() {
        let _turn = POOL_TESTS.lock().await;
        let mut all = Vec::new();
        while let Some(pipe) = Pipe::take() {
            all.push(pipe);
        }
        let (mut client, near) = socket_pair().await;
        let (far, mut site) = socket_pair().await;
        let relayed = tokio::spawn(async move {
            let end = |socket| End {
                socket,
                early: Bytes::new(),
            };
            relay(end(near), end(far), &|_, _| {}).await
        });
        let sent: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
        let expected = sent.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.shutdown().await.unwrap();
            client
        });
        let mut got = Vec::new();
        site.read_to_end(&mut got).await.unwrap();
        assert!(
            got == expected,
            "every byte arrived, in order, with no pipe to use"
        );
        drop(site);
        drop(writer.await.unwrap());
        let (forward, back) = relayed.await.unwrap().unwrap();
        assert_eq!((forward, back), (1_000_000, 0));
        drop(all);
    }

    #[test]
    fn past_the_budget_no_pipe_is_made() {
        let _turn = POOL_TESTS.blocking_lock();
        let mut taken = Vec::new();
        while let Some(pipe) = Pipe::take() {
            taken.push(pipe);
            assert!(taken.len() <= MAX_PIPES, "never more pipes than the budget");
        }
        assert!(ALIVE.load(Ordering::Acquire) <= MAX_PIPES);
        drop(taken);
    }
}
