//! How many connections fit in the process's file limit (read with
//! [`crate::file_limit::current`]).

/// Descriptors kept for everything but connections: the listener, the
/// runtime's epoll and wakers, standard streams, log files, name lookups
/// (32), and the pipes tunnels are relayed through (two each).
pub const RESERVED_FDS: u64 = 32 + 2 * crate::file_limit::MAX_PIPES as u64;
/// Never more connections than this, whatever the limit (each costs memory).
pub const MAX_CONNECTIONS: usize = 65_536;

/// The connection cap for a soft file limit of `soft`, each connection
/// needing up to `fds_per_connection` descriptors; at least 1.
pub fn connection_cap(soft: u64, fds_per_connection: u64) -> usize {
    let room = soft.saturating_sub(RESERVED_FDS) / fds_per_connection.max(1);
    usize::try_from(room)
        .unwrap_or(usize::MAX)
        .clamp(1, MAX_CONNECTIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_the_reserve_and_divides_the_rest() {
        assert_eq!(connection_cap(256, 3), 53);
        assert_eq!(connection_cap(1024, 3), 309);
        assert_eq!(connection_cap(1 << 20, 3), MAX_CONNECTIONS);
        assert_eq!(connection_cap(u64::MAX, 3), MAX_CONNECTIONS);
        assert_eq!(connection_cap(10, 3), 1, "always room for one");
    }
}
