//! Bytes copied both ways between a tunnel's two connections, holding no
//! buffer while both sides are quiet. Each read lands in a buffer on the
//! stack of the poll that made it and is written on from there at once;
//! only what the other side cannot take yet is kept, in a spill buffer that
//! is reused while bytes flow and freed once the direction is quiet. An
//! idle tunnel then costs its sockets and task, not two copy buffers
//! (10,000 idle tunnels are a normal day for a crawler fleet).

use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest read at once.
const READ_SIZE: usize = 64 * 1024;

/// One direction's state.
#[derive(Default)]
struct Direction {
    /// Read but not yet written, from `at` on.
    spill: Vec<u8>,
    at: usize,
    /// The reader ended; the writer is being shut down.
    read_done: bool,
    done: bool,
    moved: u64,
}

impl Direction {
    fn poll_copy<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut R,
        writer: &mut W,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + Unpin + ?Sized,
        W: AsyncWrite + Unpin + ?Sized,
    {
        loop {
            while self.at < self.spill.len() {
                let n = ready!(Pin::new(&mut *writer).poll_write(cx, &self.spill[self.at..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.at += n;
                self.moved += n as u64;
            }
            self.spill.clear();
            self.at = 0;
            if self.read_done {
                ready!(Pin::new(&mut *writer).poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            let mut stack = [MaybeUninit::<u8>::uninit(); READ_SIZE];
            let mut read = ReadBuf::uninit(&mut stack);
            match Pin::new(&mut *reader).poll_read(cx, &mut read) {
                Poll::Pending => {
                    // Quiet: nothing is kept for it.
                    self.spill = Vec::new();
                    ready!(Pin::new(&mut *writer).poll_flush(cx))?;
                    return Poll::Pending;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let data = read.filled();
            if data.is_empty() {
                self.read_done = true;
                continue;
            }
            let mut written = 0;
            while written < data.len() {
                match Pin::new(&mut *writer).poll_write(cx, &data[written..]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => {
                        written += n;
                        self.moved += n as u64;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {
                        // The other side is slow: keep the rest (the writer is woken for).
                        self.spill.extend_from_slice(&data[written..]);
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

/// Copies `a`'s bytes to `b` and `b`'s to `a` until both have ended (each
/// end shuts down the other side's writing); returns the bytes moved each
/// way, `(a to b, b to a)`.
pub async fn relay<A, B>(a: &mut A, b: &mut B) -> io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    let (mut a_to_b, mut b_to_a) = (Direction::default(), Direction::default());
    poll_fn(|cx| {
        let forward = if a_to_b.done {
            Poll::Ready(Ok(()))
        } else {
            a_to_b.poll_copy(cx, a, b)
        };
        let backward = if b_to_a.done {
            Poll::Ready(Ok(()))
        } else {
            b_to_a.poll_copy(cx, b, a)
        };
        match (forward, backward) {
            (Poll::Ready(Err(e)), _) | (_, Poll::Ready(Err(e))) => Poll::Ready(Err(e)),
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => Poll::Ready(Ok(())),
            _ => Poll::Pending,
        }
    })
    .await?;
    Ok((a_to_b.moved, b_to_a.moved))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    #[tokio::test]
    async fn bytes_go_both_ways_whole_through_a_slow_side_and_ends_pass_on() {
        // Small pipes: every write back-pressures, so the spill is used.
        let (client, mut near) = duplex(1000);
        let (mut far, site) = duplex(1000);
        let relayed = tokio::spawn(async move { relay(&mut near, &mut far).await });
        let up: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let down: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        let (up2, down2) = (up.clone(), down.clone());
        let client_side = tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(client);
            let writer = tokio::spawn(async move {
                w.write_all(&up2).await.unwrap();
                w.shutdown().await.unwrap();
            });
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            writer.await.unwrap();
            got
        });
        let site_side = tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(site);
            let writer = tokio::spawn(async move {
                w.write_all(&down2).await.unwrap();
                w.shutdown().await.unwrap();
            });
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            writer.await.unwrap();
            got
        });
        assert_eq!(
            site_side.await.unwrap(),
            up,
            "the site got the client's bytes, in order"
        );
        assert_eq!(
            client_side.await.unwrap(),
            down,
            "the client got the site's bytes, in order"
        );
        let (a_to_b, b_to_a) = relayed.await.unwrap().unwrap();
        assert_eq!((a_to_b, b_to_a), (up.len() as u64, down.len() as u64));
    }

    #[tokio::test]
    async fn a_quiet_tunnel_holds_no_spill() {
        let (mut client, mut near) = duplex(64);
        let (mut far, mut site) = duplex(16);
        let mut a_to_b = Direction::default();
        // A burst larger than the far pipe: what it cannot take is spilled.
        client.write_all(&[7u8; 64]).await.unwrap();
        let polled = poll_fn(|cx| Poll::Ready(a_to_b.poll_copy(cx, &mut near, &mut far))).await;
        assert!(polled.is_pending());
        assert_eq!(a_to_b.spill.len() - a_to_b.at, 48);
        let mut got = Vec::new();
        while got.len() < 64 {
            let mut piece = [0u8; 16];
            let n = site.read(&mut piece).await.unwrap();
            got.extend_from_slice(&piece[..n]);
            let _ = poll_fn(|cx| Poll::Ready(a_to_b.poll_copy(cx, &mut near, &mut far))).await;
        }
        assert_eq!(got, [7u8; 64]);
        // Drained and quiet again: the spill is gone.
        let polled = poll_fn(|cx| Poll::Ready(a_to_b.poll_copy(cx, &mut near, &mut far))).await;
        assert!(polled.is_pending());
        assert_eq!(a_to_b.spill.capacity(), 0);
        assert_eq!(a_to_b.moved, 64);
    }
}
