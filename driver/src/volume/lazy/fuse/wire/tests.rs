//! The protocol's bytes against the sizes and offsets of `linux/fuse.h`.

use super::*;

/// A request as the kernel writes it: header, then `body`.
fn request(code: u32, unique: u64, nodeid: u64, body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&((IN_HEADER + body.len()) as u32).to_le_bytes());
    bytes.extend_from_slice(&code.to_le_bytes());
    bytes.extend_from_slice(&unique.to_le_bytes());
    bytes.extend_from_slice(&nodeid.to_le_bytes());
    bytes.extend_from_slice(&[0u8; 16]);
    bytes.extend_from_slice(body);
    bytes
}

fn words(values: &[u64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn requests_are_read_at_the_headers_offsets() {
    let lookup = request(opcode::LOOKUP, 7, 1, b"db\0");
    let parsed = parse(&lookup).unwrap();
    assert_eq!(parsed.header, Header { unique: 7, nodeid: 1 });
    assert_eq!(parsed.operation, Operation::Lookup { name: b"db" });

    // fuse_read_in: fh, offset, size (and read_flags, lock_owner, flags, padding).
    let mut read_in = words(&[9, 4096]);
    read_in.extend_from_slice(&8192u32.to_le_bytes());
    read_in.extend_from_slice(&[0u8; 20]);
    let read = request(opcode::READ, 8, 5, &read_in);
    assert_eq!(parse(&read).unwrap().operation, Operation::Read { fh: 9, offset: 4096, size: 8192 });
    let readdir = request(opcode::READDIR, 9, 1, &read_in);
    assert_eq!(parse(&readdir).unwrap().operation, Operation::Readdir { offset: 4096, size: 8192 });

    let open_in = [nix::libc::O_RDONLY as u32, 0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>();
    assert_eq!(parse(&request(opcode::OPEN, 1, 5, &open_in)).unwrap().operation, Operation::Open { flags: 0 });
    assert_eq!(
        parse(&request(opcode::RELEASE, 1, 5, &words(&[3, 0, 0]))).unwrap().operation,
        Operation::Release { fh: 3 }
    );
    assert_eq!(parse(&request(16, 1, 5, &[0u8; 40])).unwrap().operation, Operation::Other(16), "WRITE");
}

#[test]
fn a_request_cut_short_is_an_error_not_a_panic() {
    let read = request(opcode::READ, 8, 5, &[0u8; 8]);
    assert_eq!(parse(&read), Err(WireError::Short(48)));
    assert_eq!(parse(&[1, 2, 3]), Err(WireError::Short(3)));
    let mut lying = request(opcode::GETATTR, 1, 1, &[0u8; 16]);
    lying[0..4].copy_from_slice(&4096u32.to_le_bytes());
    assert_eq!(parse(&lying), Err(WireError::Short(56)), "a length past the bytes read");
}

#[test]
fn init_agrees_on_the_lower_minor_and_refuses_a_kernel_too_old() {
    let body: Vec<u8> = [7u32, 40, 131072, u32::MAX].iter().flat_map(|v| v.to_le_bytes()).collect();
    let init = request(opcode::INIT, 1, 0, &body);
    let Operation::Init(kernel) = parse(&init).unwrap().operation else { panic!("not INIT") };
    let (bytes, agreed) = init_reply(1, &kernel);
    assert_eq!(agreed, Ok(Negotiated { minor: MINOR }));
    assert_eq!(bytes.len(), 16 + 64);
    assert_eq!(&bytes[16..20], &7u32.to_le_bytes());
    assert_eq!(&bytes[20..24], &MINOR.to_le_bytes());
    assert_eq!(&bytes[28..32], &(ASYNC_READ | BIG_WRITES | MAX_PAGES_FLAG).to_le_bytes(), "only what we want");
    assert_eq!(&bytes[36..40], &4096u32.to_le_bytes(), "max_write");
    assert_eq!(&bytes[44..46], &256u16.to_le_bytes(), "max_pages");

    let body: Vec<u8> = [7u32, 27, 131072, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let old = request(opcode::INIT, 2, 0, &body);
    let Operation::Init(kernel) = parse(&old).unwrap().operation else { panic!("not INIT") };
    let (bytes, agreed) = init_reply(2, &kernel);
    assert_eq!(agreed, Err(WireError::Version(7, 27)));
    assert_eq!(&bytes[4..8], &(-nix::libc::EPROTO).to_le_bytes());
}

fn file(ino: u64, size: u64) -> Attr {
    Attr {
        ino,
        size,
        time: UNIX_EPOCH + Duration::new(1_700_000_000, 5),
        kind: Kind::File,
        perm: 0o444,
        nlink: 1,
        uid: 0,
        gid: 2000,
    }
}

#[test]
fn replies_have_the_kernels_sizes_and_offsets() {
    let entry = entry(3, &file(5, 1000), Duration::from_millis(1500), Duration::from_secs(60));
    assert_eq!(entry.len(), 16 + 128);
    assert_eq!(&entry[0..4], &144u32.to_le_bytes());
    assert_eq!(&entry[8..16], &3u64.to_le_bytes(), "the request's unique");
    assert_eq!(&entry[16..24], &5u64.to_le_bytes(), "nodeid");
    assert_eq!(&entry[32..40], &60u64.to_le_bytes(), "entry_valid");
    assert_eq!(&entry[40..48], &1u64.to_le_bytes(), "attr_valid");
    assert_eq!(&entry[52..56], &500_000_000u32.to_le_bytes(), "attr_valid_nsec");
    // fuse_attr at 56: ino, size, blocks, then the times; mode at 56 + 60.
    assert_eq!(&entry[64..72], &1000u64.to_le_bytes());
    assert_eq!(&entry[72..80], &2u64.to_le_bytes(), "512-byte blocks");
    assert_eq!(&entry[116..120], &(nix::libc::S_IFREG | 0o444).to_le_bytes());
    assert_eq!(&entry[128..132], &2000u32.to_le_bytes(), "gid");

    assert_eq!(attr(4, &file(5, 1), Duration::ZERO).len(), 16 + 104);
    assert_eq!(opened(4, 11, FOPEN_KEEP_CACHE | FOPEN_NOFLUSH).len(), 32);
    assert_eq!(statfs(4).len(), 16 + 80);
    assert_eq!(&error(4, nix::libc::ENOENT)[4..8], &(-nix::libc::ENOENT).to_le_bytes());
    let notice = inval_inode(5, 0, 0);
    assert_eq!((notice.len(), &notice[4..8], &notice[8..16]), (40, &2i32.to_le_bytes()[..], &0u64.to_le_bytes()[..]));
}

#[test]
fn directory_entries_are_aligned_and_stop_at_the_size_asked() {
    let mut entries = Entries::new(64);
    assert!(entries.add(1, 1, Kind::Directory, b"."));
    assert!(entries.add(5, 2, Kind::File, b"password"), "24 + 8 bytes: 32, the whole answer now 64");
    assert!(!entries.add(6, 3, Kind::File, b"x"), "nothing past the size asked");
    let bytes = entries.reply(9);
    assert_eq!(bytes.len(), 16 + 64);
    assert_eq!(&bytes[16 + 20..16 + 24], &(nix::libc::DT_DIR as u32).to_le_bytes());
    assert_eq!(&bytes[16 + 32 + 20..16 + 32 + 24], &(nix::libc::DT_REG as u32).to_le_bytes());
    assert_eq!(&bytes[16 + 32 + 24..16 + 64], b"password");
}
