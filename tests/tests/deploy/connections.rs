//! What the node's kernel says of a pod's TCP connections: the established connections to a
//! local port from one peer, read from `/proc/<pid>/net/tcp` and `tcp6` of a process in the
//! pod's network namespace. The attack's positive control: its flood reached the ports it
//! floods, rather than failing to connect and proving nothing.

use std::net::Ipv4Addr;

/// The processes on this host whose program (the first word of their command line) ends with
/// `/{program}`.
pub fn processes_running(program: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let first = cmdline.split(|byte| *byte == 0).next()?;
            String::from_utf8_lossy(first).ends_with(&format!("/{program}")).then_some(pid)
        })
        .collect()
}

/// Established connections in the network namespace of `pid` to its local port `port` from
/// `peer` (IPv4, or IPv4 mapped into IPv6).
pub fn established_from(pid: u32, port: u16, peer: Ipv4Addr) -> usize {
    ["tcp", "tcp6"]
        .iter()
        .map(|table| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
            text.lines().skip(1).filter(|line| is_established_from(line, port, peer)).count()
        })
        .sum()
}

/// One line of `/proc/net/tcp{,6}`: `sl local rem st …`, addresses as hexadecimal words in the
/// host's byte order (little-endian here), `ADDR:PORT`; state `01` is ESTABLISHED.
fn is_established_from(line: &str, port: u16, peer: Ipv4Addr) -> bool {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (Some(local), Some(remote), Some(state)) = (fields.get(1), fields.get(2), fields.get(3)) else {
        return false;
    };
    let local_port = local.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
    // The peer's IPv4 word is the last 8 digits of either table's address (an IPv4-mapped IPv6
    // address ends with it).
    let remote_ipv4 = remote
        .split_once(':')
        .and_then(|(address, _)| address.get(address.len().saturating_sub(8)..))
        .and_then(|word| u32::from_str_radix(word, 16).ok())
        .map(|word| Ipv4Addr::from(word.to_le_bytes()));
    *state == "01" && local_port == Some(port) && remote_ipv4 == Some(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_of_both_tables_are_read_as_the_kernel_writes_them() {
        let peer = Ipv4Addr::new(10, 88, 0, 7);
        // 10.88.0.5:9808 <- 10.88.0.7:40000, established; then the same listening; then from
        // another peer.
        let v4 = "   1: 0500580A:2650 0700580A:9C40 01 00000000:00000000 00:00000000 00000000  1000 0 1 1";
        assert!(is_established_from(v4, 9808, peer));
        assert!(!is_established_from(&v4.replace(" 01 ", " 0A "), 9808, peer));
        assert!(!is_established_from(&v4.replace("0700580A:9C40", "0800580A:9C40"), 9808, peer));
        assert!(!is_established_from(v4, 8443, peer));
        let v6 =
            "   2: 0000000000000000FFFF00000500580A:20FB 0000000000000000FFFF00000700580A:9C40 01 0:0 0:0 0 0 0 1 1";
        assert!(is_established_from(v6, 8443, peer));
    }
}
