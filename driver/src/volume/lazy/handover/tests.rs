//! Frames over a real unix socket pair: a volume and its descriptor arrive together and the
//! descriptor is the same open file; what a hostile or broken sender writes is refused, naming
//! what is wrong and quoting nothing of it.

use std::io::{Read as _, Write as _};

use super::*;
use crate::volume::lazy::fuse::wire::Negotiated;
use crate::volume::lazy::open_files::OpenFilesState;

fn volume(volume_id: &str) -> HandedVolume {
    HandedVolume { volume_id: volume_id.into(), mount: mount(), files: HandedFiles::example() }
}

pub(crate) fn mount() -> HandedLazyVolume {
    HandedLazyVolume {
        negotiated: Negotiated { minor: 31 },
        mounted: (1_700_000_000, 5),
        group: 2000,
        inodes: vec!["secrets".into(), "secrets/db-password".into()],
        open_files: OpenFilesState { handles: vec![], pages: vec![], next_handle: 4 },
        contents: vec![],
    }
}

#[test]
fn a_volume_and_its_descriptor_arrive_together_and_the_end_is_said() {
    let (sender, receiver) = UnixStream::pair().unwrap();
    let (mut pipe_out, pipe_in) = std::io::pipe().unwrap();
    send(&sender, &volume("csi-a"), pipe_in.as_fd(), BOUND).unwrap();
    send(&sender, &volume("csi-b"), pipe_in.as_fd(), BOUND).unwrap();
    send_end(&sender).unwrap();
    drop(pipe_in);

    let (received, device) = receive(&receiver, BOUND).unwrap().unwrap();
    assert_eq!(received, volume("csi-a"));
    let (received, second) = receive(&receiver, BOUND).unwrap().unwrap();
    assert_eq!(received.volume_id, "csi-b");
    assert!(receive(&receiver, BOUND).unwrap().is_none(), "the end");
    // The descriptor received is the very pipe sent: what is written to it comes out.
    std::fs::File::from(device).write_all(b"same file").unwrap();
    drop(second);
    let mut read = String::new();
    pipe_out.read_to_string(&mut read).unwrap();
    assert_eq!(read, "same file");
}

/// Writes `bytes` to the socket as a raw frame, with `device` alongside when given.
fn raw(socket: &UnixStream, bytes: &[u8], device: Option<BorrowedFd>) {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let devices = device.as_slice();
    if !devices.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(devices)));
    }
    let sent = rustix::net::sendmsg(socket, &[IoSlice::new(bytes)], &mut control, SendFlags::empty()).unwrap();
    let mut writer = socket;
    writer.write_all(&bytes[sent..]).unwrap();
}

/// The bound of a node with the shipped tmpfsSize (8 MiB): the floor.
const BOUND: u64 = 256 << 20;

#[test]
fn a_frame_may_hold_twice_tmpfs_size_and_never_less_than_256_mib() {
    assert_eq!(frame_bound(8 << 20), BOUND);
    assert_eq!(frame_bound(128 << 20), BOUND);
    assert_eq!(frame_bound(512 << 20), 1 << 30, "a volume's content, base64, and its names fit");
    assert_eq!(frame_bound(u64::MAX), u64::MAX);
}

#[test]
fn a_frame_beyond_the_bound_is_refused_by_either_side() {
    let (_pipe_out, pipe_in) = std::io::pipe().unwrap();
    let (sender, receiver) = UnixStream::pair().unwrap();
    let json = serde_json::to_vec(&volume("csi-a")).unwrap().len() as u64;
    let error = send(&sender, &volume("csi-a"), pipe_in.as_fd(), json - 1).unwrap_err().to_string();
    assert_eq!(
        error,
        format!("the handover of lazy volumes: volume \"csi-a\" holds {json} bytes of state, more than {}", json - 1)
    );
    send(&sender, &volume("csi-a"), pipe_in.as_fd(), json).unwrap();
    let error = receive(&receiver, json - 1).unwrap_err().to_string();
    assert_eq!(
        error,
        format!("the handover of lazy volumes: receiving a frame: it holds {json} bytes, more than {}", json - 1)
    );
}

#[test]
fn what_a_broken_or_hostile_sender_writes_is_refused_naming_it() {
    let (_pipe_out, pipe_in) = std::io::pipe().unwrap();
    struct Case {
        name: &'static str,
        bytes: Vec<u8>,
        with_descriptor: bool,
        expected: &'static str,
    }
    let secret_json = br#"{"volume_id": "csi-a", "volume": "s3cret-content"}"#;
    let mut bad_json = (secret_json.len() as u64).to_le_bytes().to_vec();
    bad_json.extend_from_slice(secret_json);
    let cases = [
        Case {
            name: "a frame claiming a terabyte",
            bytes: (1u64 << 40).to_le_bytes().to_vec(),
            with_descriptor: true,
            expected: "the handover of lazy volumes: receiving a frame: it holds 1099511627776 bytes, more than 268435456",
        },
        Case {
            name: "a frame without its descriptor",
            bytes: 10u64.to_le_bytes().to_vec(),
            with_descriptor: false,
            expected: "the handover of lazy volumes: receiving a frame: it carried 0 descriptors, not one",
        },
        Case {
            name: "an end with a descriptor",
            bytes: 0u64.to_le_bytes().to_vec(),
            with_descriptor: true,
            expected: "the handover of lazy volumes: receiving the end: it carried a descriptor",
        },
        Case {
            name: "JSON that is not a volume",
            bytes: bad_json,
            with_descriptor: true,
            expected: "the handover of lazy volumes: reading a frame: not a volume's state (line 1, column ",
        },
    ];
    for case in cases {
        let (sender, receiver) = UnixStream::pair().unwrap();
        raw(&sender, &case.bytes, case.with_descriptor.then(|| pipe_in.as_fd()));
        let error = receive(&receiver, BOUND).unwrap_err().to_string();
        assert!(error.starts_with(case.expected), "{}: {error}", case.name);
        assert!(!error.contains("s3cret"), "{}: {error}", case.name);
    }

    let (sender, receiver) = UnixStream::pair().unwrap();
    raw(&sender, &50u64.to_le_bytes(), Some(pipe_in.as_fd()));
    drop(sender);
    let error = receive(&receiver, BOUND).unwrap_err().to_string();
    assert!(error.starts_with("the handover of lazy volumes: receiving a frame: "), "cut short: {error}");

    let (sender, receiver) = UnixStream::pair().unwrap();
    drop(sender);
    let error = receive(&receiver, BOUND).unwrap_err().to_string();
    assert_eq!(error, "the handover of lazy volumes: receiving a frame: the sender closed the socket before the end");
}

#[test]
fn each_word_is_heard_as_said_and_anything_else_is_refused() {
    let (sender, receiver) = UnixStream::pair().unwrap();
    for word in [Word::Ask, Word::AskWithSockets, Word::Taken, Word::Refused, Word::LetGo, Word::Proved] {
        say(&sender, word).unwrap();
        assert_eq!(hear(&receiver, "a word").unwrap(), word);
    }
    (&sender).write_all(b"GET / HT").unwrap();
    let error = hear(&receiver, "a successor's request").unwrap_err().to_string();
    assert_eq!(
        error,
        "the handover of lazy volumes: waiting for a successor's request: the other side said something else"
    );
    drop(sender);
    let error = hear(&receiver, "the successor to take the volumes").unwrap_err().to_string();
    assert!(
        error.starts_with("the handover of lazy volumes: waiting for the successor to take the volumes: "),
        "{error}"
    );
}

#[test]
fn a_listening_socket_travels_with_its_path_and_is_the_same_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("csi.sock");
    let listening = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let (sender, receiver) = UnixStream::pair().unwrap();
    let handed = ListeningSocket { path: path.clone(), listener: listening.as_fd().try_clone_to_owned().unwrap() };
    send_socket(&sender, &handed).unwrap();
    send_end(&sender).unwrap();
    let Frame::Socket(received) = receive_frame(&receiver, BOUND).unwrap() else { panic!("not a socket's frame") };
    assert_eq!(received.path, path);
    assert!(matches!(receive_frame(&receiver, BOUND).unwrap(), Frame::End));
    // What connects to the path is accepted on the descriptor received.
    drop((handed, listening));
    let mut client = UnixStream::connect(&path).unwrap();
    client.write_all(b"hello").unwrap();
    let (mut accepted, _) = std::os::unix::net::UnixListener::from(received.listener).accept().unwrap();
    let mut heard = [0u8; 5];
    accepted.read_exact(&mut heard).unwrap();
    assert_eq!(&heard, b"hello");
    // A version-1 reader of volumes refuses a socket's frame rather than misreading it.
    let (sender, receiver) = UnixStream::pair().unwrap();
    let listening = std::os::unix::net::UnixListener::bind(dir.path().join("other.sock")).unwrap();
    let other = ListeningSocket { path: dir.path().join("other.sock"), listener: listening.into() };
    send_socket(&sender, &other).unwrap();
    let error = receive(&receiver, BOUND).unwrap_err().to_string();
    assert_eq!(error, "the handover of lazy volumes: receiving a frame: a socket came where a volume was expected");
}

#[test]
fn a_broken_or_hostile_sockets_frame_is_refused_naming_it() {
    let (_pipe_out, pipe_in) = std::io::pipe().unwrap();
    let frame = |path: &[u8]| {
        let mut bytes = SOCKET.to_vec();
        bytes.extend_from_slice(&(path.len() as u64).to_le_bytes());
        bytes.extend_from_slice(path);
        bytes
    };
    let cases: [(&str, Vec<u8>, bool, &str); 4] = [
        ("without its descriptor", frame(b"/csi.sock"), false, "receiving a socket: it carried 0 descriptors, not one"),
        ("an empty path", frame(b""), true, "receiving a socket: its path is 0 bytes, not 1 to 107"),
        (
            "a path longer than a socket's",
            frame(&[b'a'; 200]),
            true,
            "receiving a socket: its path is 200 bytes, not 1 to 107",
        ),
        ("a relative path", frame(b"csi.sock"), true, "receiving a socket: its path is not absolute"),
    ];
    for (name, bytes, with_descriptor, expected) in cases {
        let (sender, receiver) = UnixStream::pair().unwrap();
        raw(&sender, &bytes, with_descriptor.then(|| pipe_in.as_fd()));
        let error = receive_frame(&receiver, BOUND).map(drop).unwrap_err().to_string();
        assert_eq!(error, format!("the handover of lazy volumes: {expected}"), "{name}");
    }
    // A path a socket cannot have is not sent either.
    let (sender, _receiver) = UnixStream::pair().unwrap();
    let long = ListeningSocket { path: PathBuf::from(format!("/{}", "a".repeat(120))), listener: pipe_in.into() };
    let error = send_socket(&sender, &long).unwrap_err().to_string();
    assert_eq!(error, "the handover of lazy volumes: sending a socket: its path is 121 bytes, more than a socket's");
}

#[test]
fn a_successor_keeps_no_more_sockets_than_a_driver_listens_on() {
    let state = tempfile::tempdir().unwrap();
    let listener = std::os::unix::net::UnixListener::bind(state.path().join(SOCKET_FILE)).unwrap();
    let sockets = tempfile::tempdir().unwrap();
    let predecessor = std::thread::spawn(move || {
        let (socket, _) = listener.accept().unwrap();
        assert_eq!(hear(&socket, "the request").unwrap(), Word::AskWithSockets);
        let sent = ["a.sock", "b.sock", "c.sock"]
            .into_iter()
            .try_for_each(|name| {
                let path = sockets.path().join(name);
                let bound = std::os::unix::net::UnixListener::bind(&path).unwrap();
                send_socket(&socket, &ListeningSocket { path, listener: bound.into() })
            })
            .and_then(|()| send_end(&socket));
        // The successor refuses at the third socket and closes: the end (on a busy machine, the
        // third socket too) may meet a closed connection. Its word was said before it closed.
        drop(sent);
        hear(&socket, "the successor's answer").unwrap()
    });
    let content = crate::content::StaticDirSource::new(state.path().join("shares"));
    let error = take::ask(state.path(), &content, 1 << 20).map(drop).unwrap_err().to_string();
    assert_eq!(error, "the running driver sent more than 2 sockets");
    assert_eq!(predecessor.join().unwrap(), Word::Refused, "the predecessor is told, and serves on");
}

#[test]
fn a_challenge_is_lowercase_hex_digits_and_nothing_else() {
    // The challenge names a file in the state directory: anything but lowercase hex digits
    // (a `/`, a `.`, an uppercase name another file could have) is refused before it is used.
    let challenge = |digits: &str| {
        let (sender, receiver) = UnixStream::pair().unwrap();
        send_challenge(&sender, digits).unwrap();
        receive_frame(&receiver, BOUND).map(|frame| match frame {
            Frame::Prove(heard) => heard,
            _ => panic!("not a challenge"),
        })
    };
    let good = "0123456789abcdef0123456789abcdef";
    assert_eq!(challenge(good).unwrap(), good);
    for bad in
        ["0123456789ABCDEF0123456789abcdef", "0123456789abcdefg123456789abcdef", "../../../../etc/passwd/aaaaaaaaa"]
    {
        assert_eq!(bad.len(), CHALLENGE_DIGITS);
        let error = challenge(bad).unwrap_err().to_string();
        assert_eq!(
            error, "the handover of lazy volumes: receiving a challenge: it is not lowercase hex digits",
            "{bad}"
        );
    }
}

#[test]
fn a_socket_path_of_a_sockets_longest_length_is_sent() {
    // 107 bytes, the longest path a unix socket binds to (sun_path's 108 with its NUL), is sent
    // and received; one byte more is refused by both sides (above).
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().as_os_str().len() + 1;
    let path = dir.path().join("s".repeat(SOCKET_PATH_MAX as usize - prefix));
    assert_eq!(path.as_os_str().len() as u64, SOCKET_PATH_MAX);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let (sender, receiver) = UnixStream::pair().unwrap();
    send_socket(&sender, &ListeningSocket { path: path.clone(), listener: listener.into() }).unwrap();
    let Frame::Socket(received) = receive_frame(&receiver, BOUND).unwrap() else { panic!("not a socket's frame") };
    assert_eq!(received.path, path);
}
